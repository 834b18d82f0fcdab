//! The dispatcher of one queue: claims as many jobs as its endpoint has
//! room for, through the claim batcher (parked like a worker's claim, so
//! the same local and Redis wake-ups bring it a job enqueued elsewhere in
//! milliseconds, and the same flow control holds), and sends each. While
//! its claims find jobs, the next one rides the finisher instead: made in
//! the transaction that writes the outcomes of its other requests (through
//! the same limited path), as a pull worker's finish-and-claim is, so a busy
//! queue costs no claim transaction of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use runlease_protocol::QueueName;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::FinishWork;
use crate::batch::claims::ClaimAsk;
use crate::endpoint::Endpoints;
use crate::endpoint::health::Health;
use crate::endpoint::metrics::EndpointMetrics;
use crate::store::StoreError;
use crate::store::rows::ClaimedJob;

/// How long a claim of the dispatcher stays parked before it asks again
/// (a wake-up ends it sooner).
const CLAIM_WAIT: Duration = Duration::from_secs(30);
/// The pause after a claim failed (PostgreSQL unreachable).
const CLAIM_RETRY: Duration = Duration::from_secs(1);

/// One queue's dispatcher and what its requests share.
pub(super) struct QueueDispatcher {
    pub(super) endpoints: Arc<Endpoints>,
    pub(super) queue: QueueName,
    pub(super) health: Health,
    /// Requests open.
    open: AtomicUsize,
    /// Signalled as each request ends (room for another).
    freed: Notify,
}

/// Counts a request open until it is dropped, however it ends.
pub(super) struct OpenRequest(Arc<QueueDispatcher>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
        self.0
            .endpoints
            .state
            .metrics
            .endpoint
            .in_flight
            .get_or_create(&EndpointMetrics::queue(self.0.queue.as_str()))
            .dec();
        self.0.freed.notify_one();
    }
}

impl QueueDispatcher {
    pub(super) fn new(endpoints: Arc<Endpoints>, queue: QueueName) -> Arc<Self> {
        let health = Health::new(endpoints.settings.backoff, endpoints.settings.backoff_max);
        Arc::new(Self {
            endpoints,
            queue,
            health,
            open: AtomicUsize::new(0),
            freed: Notify::new(),
        })
    }

    fn opened(self: &Arc<Self>) -> OpenRequest {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.endpoints
            .state
            .metrics
            .endpoint
            .in_flight
            .get_or_create(&EndpointMetrics::queue(self.queue.as_str()))
            .inc();
        OpenRequest(self.clone())
    }

    /// Claims and sends until `stop` (the endpoint removed, or shutdown);
    /// then aborts what is open (each lease released) and returns.
    pub(super) async fn run(self: Arc<Self>, stop: CancellationToken) {
        let metrics = &self.endpoints.state.metrics.endpoint;
        metrics
            .healthy
            .get_or_create(&EndpointMetrics::queue(self.queue.as_str()))
            .set(1);
        let requests = TaskTracker::new();
        // Whether the last claim found jobs (the next then rides the finisher).
        let mut busy = false;
        while !stop.is_cancelled() {
            let Some(room) = self.room(&stop).await else {
                continue;
            };
            let ask = ClaimAsk {
                queues: vec![self.queue.clone()],
                worker: self.endpoints.worker.clone(),
                max_jobs: u32::try_from(room).unwrap_or(u32::MAX),
                time_left_ms: None,
                wait: CLAIM_WAIT,
            };
            let claimed = tokio::select! {
                claimed = self.claim(ask, busy) => claimed,
                () = stop.cancelled() => break,
            };
            busy = claimed.as_ref().is_ok_and(|jobs| !jobs.is_empty());
            match claimed {
                Ok(jobs) => {
                    for job in jobs {
                        let open = self.opened();
                        requests.spawn(super::request::send(self.clone(), job, open, stop.clone()));
                    }
                }
                Err(e) => {
                    tracing::warn!(queue = %self.queue, error = %e, "endpoint dispatcher: cannot claim; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(CLAIM_RETRY) => {}
                        () = stop.cancelled() => {}
                    }
                }
            }
        }
        requests.close();
        requests.wait().await;
    }

    /// Claims `ask`: while the queue is `busy`, riding the finisher's next
    /// transaction (no wait: nothing claimable answers empty at once);
    /// otherwise parked in the claim batcher until a job is claimable or the
    /// wait runs out. Leases of a claim given up (the dispatcher stopping)
    /// are given back uncharged by either.
    async fn claim(&self, ask: ClaimAsk, busy: bool) -> Result<Vec<ClaimedJob>, StoreError> {
        let state = &self.endpoints.state;
        if busy {
            let done = state
                .finisher
                .submit(FinishWork::new(Vec::new(), Some(ask)))
                .await?;
            return Ok(done.leases.unwrap_or_default());
        }
        state.claims.claim(ask).await
    }

    /// Waits until a request may be sent (the endpoint not paused, room
    /// under its concurrency) and answers how many; `None` to look again
    /// (stopped, or the endpoint is gone from the view).
    async fn room(&self, stop: &CancellationToken) -> Option<usize> {
        if let Some(pause) = self.health.paused_for() {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = stop.cancelled() => {}
            }
            return None;
        }
        let Some((setting, _)) = self.endpoints.state.flow.endpoint(&self.queue) else {
            tokio::select! {
                () = tokio::time::sleep(super::LOOK_INTERVAL) => {}
                () = stop.cancelled() => {}
            }
            return None;
        };
        let concurrency = usize::try_from(setting.concurrency).unwrap_or(1);
        let room = concurrency.saturating_sub(self.open.load(Ordering::Relaxed));
        if room == 0 {
            tokio::select! {
                () = self.freed.notified() => {}
                () = stop.cancelled() => {}
            }
            return None;
        }
        Some(room)
    }
}
