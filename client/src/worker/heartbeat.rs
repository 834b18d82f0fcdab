//! The heartbeat loop: one `POST /v1/heartbeat` per interval for every held
//! lease; its answers renew, stop (lease lost) or cancel (cancel requested)
//! the handlers.

use std::sync::Arc;

use runlease_protocol::worker::{HeartbeatItem, HeartbeatRequest, HeartbeatStatus};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lease::{Held, StopReason};
use super::{FALLBACK_HEARTBEAT, Inner};

/// One heartbeat request per interval for every held lease.
pub(super) async fn heartbeat_loop(inner: Arc<Inner>, stop: CancellationToken) {
    let mut last = Instant::now();
    loop {
        let interval = inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(|h| h.heartbeat_interval)
            .min()
            .unwrap_or(FALLBACK_HEARTBEAT);
        tokio::select! {
            () = tokio::time::sleep_until(last + interval) => {}
            // A new lease may beat more often: recompute the interval.
            () = inner.added.notified() => continue,
            () = stop.cancelled() => return,
        }
        last = Instant::now();
        let held: Vec<Arc<Held>> = inner
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|h| h.stop_reason().is_none())
            .cloned()
            .collect();
        for chunk in held.chunks(runlease_protocol::limits::MAX_LEASES_PER_REQUEST) {
            let req = HeartbeatRequest {
                leases: chunk
                    .iter()
                    .map(|h| HeartbeatItem {
                        lease_token: h.token.clone(),
                        progress: h.progress(),
                    })
                    .collect(),
            };
            let sent = Instant::now();
            match inner.client.heartbeat(&req, false).await {
                Ok(answer) => {
                    for (h, result) in chunk.iter().zip(answer.leases) {
                        match result.status {
                            HeartbeatStatus::Renewed => h.renewed(sent),
                            HeartbeatStatus::CancelRequested => {
                                h.renewed(sent);
                                h.stop(StopReason::CancelRequested);
                            }
                            HeartbeatStatus::LeaseLost => h.stop(StopReason::LeaseLost),
                        }
                    }
                }
                // The fence timers of the leases decide when this is too long.
                Err(e) => tracing::warn!(error = %e, leases = chunk.len(), "heartbeat failed"),
            }
        }
    }
}
