//! The repair loop: jobs whose wake-up could not be published were marked
//! `enqueue_failed` (and stayed claimable). Once Redis takes publishes again,
//! this loop re-sends their wake-ups and moves them to `queued`. Rows are
//! locked with SKIP LOCKED while the wake-ups go out, so with any number of
//! coordinators each job is repaired once.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, QueueLabels};
use crate::store::{Store, StoreError};
use crate::wake::{Wake, every};

/// Most jobs one repair statement takes; a full batch is followed at once by another.
pub const REPAIR_BATCH: i64 = 1000;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RepairReport {
    /// Jobs moved back to `queued`.
    pub repaired: usize,
    /// Whether a publish failed (Redis still down): the jobs stay as they were.
    pub publish_failed: bool,
}

/// The repair loop of one coordinator.
#[derive(Clone)]
pub struct Repairer {
    store: Store,
    wake: Wake,
    metrics: Arc<Metrics>,
    interval: Duration,
}

impl Repairer {
    /// A repair loop running every `interval` (with jitter).
    pub fn new(store: Store, wake: Wake, metrics: Arc<Metrics>, interval: Duration) -> Self {
        Self {
            store,
            wake,
            metrics,
            interval,
        }
    }

    /// One pass: repairs every `enqueue_failed` job, in batches.
    pub async fn run_once(&self) -> Result<RepairReport, StoreError> {
        let mut report = RepairReport::default();
        loop {
            let failed = std::sync::atomic::AtomicBool::new(false);
            let flag = &failed;
            let wake = &self.wake;
            let repaired = self
                .store
                .repair_enqueue_failed(REPAIR_BATCH, |queues| async move {
                    for queue in &queues {
                        if let Err(e) = wake.republish(queue).await {
                            tracing::debug!(error = %e, "repair: wake-up still cannot be published");
                            flag.store(true, std::sync::atomic::Ordering::Relaxed);
                            return false;
                        }
                    }
                    true
                })
                .await?;
            let failed = failed.into_inner();
            report.publish_failed |= failed;
            for queue in &repaired {
                self.metrics
                    .enqueue_failed_repairs
                    .get_or_create(&QueueLabels {
                        queue: queue.to_string(),
                    })
                    .inc();
            }
            report.repaired += repaired.len();
            if failed || (repaired.len() as i64) < REPAIR_BATCH {
                if report.repaired > 0 {
                    tracing::info!(repaired = report.repaired, "repaired enqueue_failed jobs");
                }
                return Ok(report);
            }
        }
    }

    /// Runs passes until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        every(self.interval, &cancel, || async {
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "repair pass failed; retrying next interval");
            }
        })
        .await;
    }
}
