//! The claim floors' check: now and then, a full scan of each queue with a
//! claim floor finds the first claimable job from the queue's first entry,
//! and lowers a floor that job sorts below (a job written without its
//! wake-up reaching this coordinator: see [`crate::store::floors`]). The
//! scan walks what the floor spares the claims, so it waits ten times as
//! long as it took before the next ([`every_paced`]), and at least the
//! claims' re-check interval.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use crate::wake::every_paced;

/// The claim floors' check of one coordinator.
pub struct FloorCheck {
    store: Store,
    metrics: Arc<Metrics>,
    every: Duration,
}

impl FloorCheck {
    /// A check at most every `every` (with jitter).
    pub fn new(store: Store, metrics: Arc<Metrics>, every: Duration) -> Self {
        Self {
            store,
            metrics,
            every,
        }
    }

    /// One check: answers the floors lowered.
    pub async fn run_once(&self) -> Result<usize, StoreError> {
        let lowered = self.store.check_claim_floors().await?;
        if lowered > 0 {
            self.metrics.claim_floor_misses.inc_by(lowered as u64);
            tracing::warn!(
                queues = lowered,
                "a claimable job sorted below its queue's claim floor (written without a wake-up reaching this coordinator); floor lowered"
            );
        }
        Ok(lowered)
    }

    /// Runs checks until `cancel` fires, paced by how long they take.
    pub async fn run(self, cancel: CancellationToken) {
        every_paced(self.every, &cancel, || async {
            match self.run_once().await {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "claim floor check failed; retrying");
                    false
                }
            }
        })
        .await;
    }
}
