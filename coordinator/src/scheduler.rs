//! The schedule loop: every half second, due schedules enqueue the job of
//! their fire time. Every coordinator runs it; `SKIP LOCKED` spreads the
//! schedules over them, and each fire time's job carries the idempotency
//! key `schedule:<name>:<fire time>`, so a fire time is enqueued once
//! whatever the number of coordinators, restarts or clock differences.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, QueueLabels};
use crate::store::{Store, StoreError};
use crate::wake::Wake;

/// How often due schedules are looked for.
pub const TICK: Duration = Duration::from_millis(500);
/// Schedules fired per pass statement (their enqueues share its deadline).
const BATCH: i64 = 10;

/// The schedule loop of one coordinator.
#[derive(Clone)]
pub struct Scheduler {
    store: Store,
    wake: Wake,
    metrics: Arc<Metrics>,
}

impl Scheduler {
    /// A scheduler enqueuing on `store`.
    pub fn new(store: Store, wake: Wake, metrics: Arc<Metrics>) -> Self {
        Self { store, wake, metrics }
    }

    /// One pass: fires every due schedule; answers how many jobs it created.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let mut created = 0;
        loop {
            let fired = self.store.fire_schedules(BATCH).await?;
            let full = fired.len() as i64 >= BATCH;
            for f in fired.iter().filter(|f| f.job.created) {
                created += 1;
                let labels = QueueLabels {
                    queue: f.job.job.queue.to_string(),
                };
                self.metrics.enqueued.get_or_create(&labels).inc();
                self.metrics.schedule_fires.get_or_create(&labels).inc();
                tracing::info!(schedule = %f.schedule, fire = %f.fire, job_id = %f.job.job.id, "schedule fired");
                if let Err(e) = self.wake.enqueued(std::slice::from_ref(&f.job.job.queue)).await {
                    // Committed either way: claims find it on their timer, and
                    // the repair loop re-sends the wake-up of a marked job.
                    tracing::warn!(error = %e, "wake-up of a scheduled job not delivered");
                    if let Ok(marked) = self.store.mark_enqueue_failed(&[f.job.job.id]).await {
                        for (_, queue) in marked {
                            self.metrics
                                .enqueue_failed_marks
                                .get_or_create(&QueueLabels {
                                    queue: queue.to_string(),
                                })
                                .inc();
                        }
                    }
                }
            }
            if !full {
                return Ok(created);
            }
        }
    }

    /// Runs passes every [`TICK`] until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
            }
            if let Err(e) = self.run_once().await {
                self.metrics.schedule_errors.inc();
                tracing::warn!(error = %e, "schedule pass failed; retrying");
            }
        }
    }
}
