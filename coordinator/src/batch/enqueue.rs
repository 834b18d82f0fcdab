//! [`Enqueuer`]: single-job enqueues of many requests written in one
//! statement and one transaction (group commit), as finishes are. A lone
//! enqueue is written at once; while one batch commits, the next gathers.
//! Each request is answered with its own job once its batch committed; a
//! repeated idempotency key answers the original, even when the original
//! came in the same batch.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::{BatchSettings, Batcher, Parts, Pass};
use crate::store::jobs::{Enqueued, NewJob};
use crate::store::{Store, StoreError};

/// The batcher of single-job enqueues (`POST /v1/jobs`). Each request is
/// answered with its own job, or with its own error: a value PostgreSQL
/// refuses fails only the request that sent it.
pub type Enqueuer = Batcher<NewJob, Result<Enqueued, StoreError>>;

/// Starts the enqueuer: each batch is one multi-row insert in one
/// transaction ([`crate::store::Store::enqueue`]). It never waits for
/// company (`max_delay` is for finishes): an enqueue is written at once, or
/// with those that arrived while the batch before it was committing.
pub fn enqueuer(
    parts: &Parts,
    settings: BatchSettings,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> Enqueuer {
    let store = parts.store.clone();
    let settings = BatchSettings {
        max_delay: std::time::Duration::ZERO,
        ..settings
    };
    Batcher::spawn(
        "enqueue",
        settings,
        parts.metrics.clone(),
        tracker,
        cancel,
        None,
        move |jobs: Arc<Vec<NewJob>>| {
            let store = store.clone();
            async move { write(&store, &jobs).await }
        },
    )
}

/// Writes a batch in one statement. Should PostgreSQL refuse a value of one
/// job (nothing was written), each job is written alone, so the refusal is
/// answered to its own request only.
async fn write(
    store: &Store,
    jobs: &[NewJob],
) -> Result<Vec<Pass<NewJob, Result<Enqueued, StoreError>>>, StoreError> {
    match store.enqueue(jobs).await {
        Ok(enqueued) => Ok(enqueued.into_iter().map(|e| Pass::Answer(Ok(e))).collect()),
        Err(StoreError::Rejected(why)) if jobs.len() > 1 => {
            tracing::debug!(jobs = jobs.len(), %why, "enqueue batch refused a value: writing each job alone");
            let mut answers = Vec::with_capacity(jobs.len());
            for job in jobs {
                let one = store.enqueue(std::slice::from_ref(job)).await;
                answers.push(Pass::Answer(one.and_then(|mut e| {
                    e.pop()
                        .ok_or_else(|| StoreError::Database("enqueue answered no job".into()))
                })));
            }
            Ok(answers)
        }
        Err(e) => Err(e),
    }
}
