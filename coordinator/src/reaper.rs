//! The reaper: takes back leases whose holders stopped heartbeating. Its
//! statement is guarded on the lease it read and uses SKIP LOCKED, so any
//! number of coordinators may run it against one database at once.

use std::sync::Arc;
use std::time::Duration;

use runlease_protocol::JobState;
use tokio_util::sync::CancellationToken;

use crate::metrics::{Metrics, Via};
use crate::store::{Store, StoreError};
use crate::wake::{Wake, every};

/// Most leases one statement reaps; a full batch is followed at once by another.
pub const REAP_BATCH: i64 = 500;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReapReport {
    /// Jobs queued again (budget left).
    pub requeued: usize,
    /// Jobs failed (budget spent).
    pub failed: usize,
    /// Jobs cancelled (a cancel was requested).
    pub cancelled: usize,
}

impl ReapReport {
    /// Leases reaped in all.
    pub fn total(&self) -> usize {
        self.requeued + self.failed + self.cancelled
    }
}

/// The reaper of one coordinator.
#[derive(Clone)]
pub struct Reaper {
    store: Store,
    metrics: Arc<Metrics>,
    wake: Wake,
    interval: Duration,
}

impl Reaper {
    /// A reaper that runs every `interval` (with jitter).
    pub fn new(store: Store, metrics: Arc<Metrics>, wake: Wake, interval: Duration) -> Self {
        Self {
            store,
            metrics,
            wake,
            interval,
        }
    }

    /// One pass: reaps every lease expired now, in batches.
    pub async fn run_once(&self) -> Result<ReapReport, StoreError> {
        let mut report = ReapReport::default();
        loop {
            let reaped = self.store.reap(REAP_BATCH).await?;
            let full = reaped.len() as i64 >= REAP_BATCH;
            for (job, dead_letter) in reaped {
                if let Some(dead_letter) = &dead_letter {
                    self.metrics
                        .dead_lettered(&self.wake, job.id, &job.queue, dead_letter);
                }
                self.metrics.transition(&job, Via::Reap);
                tracing::warn!(job_id = %job.id, run_lease = job.run_lease.0, state = %job.state, "lease expired; job reaped");
                match job.state {
                    JobState::Queued => {
                        report.requeued += 1;
                        self.wake.ready(&job.queue);
                    }
                    JobState::Failed => {
                        report.failed += 1;
                        self.wake.terminal(job.id);
                        // Its slot is free, should the queue have a limit.
                        self.wake.ready(&job.queue);
                    }
                    _ => {
                        report.cancelled += 1;
                        self.wake.terminal(job.id);
                        self.wake.ready(&job.queue);
                    }
                }
            }
            if !full {
                return Ok(report);
            }
        }
    }

    /// Runs passes until `cancel` fires.
    pub async fn run(self, cancel: CancellationToken) {
        every(self.interval, &cancel, || async {
            if let Err(e) = self.run_once().await {
                self.metrics.reaper_errors.inc();
                tracing::warn!(error = %e, "reaper pass failed; retrying next interval");
            }
        })
        .await;
    }
}
