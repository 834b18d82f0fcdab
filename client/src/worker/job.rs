//! One job's task: run its handler under its lease, stop it when it must
//! stop, and finish the attempt as its end requires.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runlease_protocol::worker::Lease;
use tokio::sync::OwnedSemaphorePermit;

use crate::worker::finisher::FinishQueue;
use crate::worker::lease::{Claimed, Held, StopReason, is_lease_lost};
use crate::worker::{Handler, Inner, JobContext};

/// Runs one handler and finishes its attempt as its end requires. Its slot
/// (`permit`) goes with the outcome to the finishing queue, so the request
/// that carries the outcome can claim the slot's next job.
pub(crate) async fn run_job(
    inner: Arc<Inner>,
    finisher: FinishQueue,
    handler: Handler,
    lease: Lease,
    held: Arc<Held>,
    permit: OwnedSemaphorePermit,
) {
    let ctx = JobContext {
        job_id: lease.job_id,
        run_lease: lease.run_lease,
        attempt: lease.attempt,
        queue: lease.queue.clone(),
        payload: lease.payload,
        checkpoint: lease.progress,
        held: held.clone(),
    };
    let timeout = Duration::from_millis(lease.timeout_ms);
    let fut = handler(ctx);
    tokio::pin!(fut);
    let mut outcome = tokio::select! {
        result = &mut fut => Some(result),
        () = held.cancel.cancelled() => None,
        () = tokio::time::sleep_until(held.granted_at + timeout) => { held.stop(StopReason::TimedOut); None }
        () = held.fence_when_unrenewed() => None,
    };
    if outcome.is_none() {
        // Stopped: the handler gets a grace to return, then is dropped.
        outcome = tokio::time::timeout(inner.stop_grace, &mut fut).await.ok();
    }
    inner
        .held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&lease.job_id);
    let claimed = Claimed::new(finisher, &held, Some(permit));
    let counters = &inner.counters;

    let finished = match (held.stop_reason(), outcome) {
        // Finished on its own: its outcome stands.
        (None, Some(Ok(result))) => claimed.complete(result).await.map(|()| &counters.completed),
        (None, Some(Err(e))) => claimed
            .fail(e.message, e.retryable, e.retry_after)
            .await
            .map(|()| &counters.failed),
        // Done within the grace of a drain or deadline: the work stands too.
        (Some(StopReason::Drain | StopReason::Deadline), Some(Ok(result))) => {
            claimed.complete(result).await.map(|()| &counters.completed)
        }
        (Some(StopReason::LeaseLost | StopReason::Fenced), _) | (None, None) => {
            claimed.abandon();
            Ok(&counters.abandoned)
        }
        (Some(StopReason::CancelRequested), _) => claimed
            .fail("cancelled: a cancel was requested".into(), false, None)
            .await
            .map(|()| &counters.failed),
        (Some(StopReason::TimedOut), _) => claimed
            .fail(
                format!("attempt exceeded its timeout of {} ms", lease.timeout_ms),
                true,
                None,
            )
            .await
            .map(|()| &counters.failed),
        (Some(StopReason::Drain | StopReason::Deadline), _) => claimed
            .release(held.progress())
            .await
            .map(|()| &counters.released),
    };
    match finished {
        Ok(counter) => {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            counters.abandoned.fetch_add(1, Ordering::Relaxed);
            if is_lease_lost(&e) {
                tracing::info!("the lease was lost before the attempt finished; result discarded");
            } else {
                tracing::warn!(error = %e, "could not finish the attempt; the lease will expire and the job run again");
            }
        }
    }
}
