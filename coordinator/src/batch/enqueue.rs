//! [`Enqueuer`]: single-job enqueues of many requests written in one
//! statement and one transaction (group commit), as finishes are. A lone
//! enqueue is written at once; while one batch commits, the next gathers.
//! Each request is answered with its own job once its batch committed and
//! announced (one wake-up per queue for the whole batch, [`NewJobs`]); a
//! repeated idempotency key answers the original, even when the original
//! came in the same batch.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use runlease_protocol::{JobId, JobState, QueueName};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::{BatchSettings, Batcher, Parts, Pass};
use crate::metrics::{Metrics, QueueLabels};
use crate::store::floors::ClaimKey;
use crate::store::jobs::{Enqueued, NewJob};
use crate::store::{Store, StoreError};
use crate::wake::Wake;

/// The batcher of single-job enqueues (`POST /v1/jobs`). Each request is
/// answered with its own job, or with its own error: a value PostgreSQL
/// refuses fails only the request that sent it.
pub type Enqueuer = Batcher<NewJob, Result<Enqueued, StoreError>>;

/// Jobs an enqueue created, to announce once it committed: the wake-up of
/// each of their queues (local claims and, through Redis, every
/// coordinator's), carrying the queue's first new job in claim order.
#[derive(Debug, Default)]
pub struct NewJobs {
    queues: Vec<(QueueName, ClaimKey)>,
    ids: Vec<JobId>,
}

impl NewJobs {
    /// Adds a job this enqueue created, at `priority` and `run_at` in its
    /// queue's claim order (a job cancelled as it was enqueued, its
    /// dependency already failed, is never claimable: not announced).
    pub fn add(
        &mut self,
        id: JobId,
        queue: &QueueName,
        state: JobState,
        priority: i32,
        run_at: DateTime<Utc>,
    ) {
        if state == JobState::Cancelled {
            return;
        }
        self.ids.push(id);
        let key = ClaimKey {
            priority,
            run_at,
            id: id.0,
        };
        match self.queues.iter_mut().find(|(q, _)| q == queue) {
            Some((_, first)) => *first = key.min(*first),
            None => self.queues.push((queue.clone(), key)),
        }
    }

    /// Sends the wake-ups, once per queue. When they cannot be published the
    /// jobs are marked `enqueue_failed`: still claimable, published again by
    /// the repair loop. Answers the jobs marked (none when the wake-ups went
    /// out, or when the mark failed too: the jobs are committed either way,
    /// and claims find them on their timer).
    pub async fn announce(self, wake: &Wake, store: &Store, metrics: &Metrics) -> Vec<JobId> {
        if self.queues.is_empty() {
            return Vec::new();
        }
        let Err(e) = wake.enqueued_at(&self.queues).await else {
            return Vec::new();
        };
        let marked = match store.mark_enqueue_failed(&self.ids).await {
            Ok(marked) => marked,
            Err(mark_error) => {
                tracing::error!(error = %e, %mark_error, "wake-up not delivered and jobs not marked enqueue_failed");
                return Vec::new();
            }
        };
        tracing::warn!(error = %e, jobs = marked.len(), "wake-up not delivered: jobs marked enqueue_failed");
        for (_, queue) in &marked {
            metrics
                .enqueue_failed_marks
                .get_or_create(&QueueLabels {
                    queue: queue.to_string(),
                })
                .inc();
        }
        marked.into_iter().map(|(id, _)| id).collect()
    }
}

/// Starts the enqueuer: each batch is one multi-row insert in one
/// transaction ([`crate::store::Store::enqueue`]), announced once it
/// committed ([`NewJobs`]), before its requests are answered. It never
/// waits for company (`max_delay` is for finishes): an enqueue is written
/// at once, or with those that arrived while the batch before it was
/// committing.
pub fn enqueuer(
    parts: &Parts,
    settings: BatchSettings,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> Enqueuer {
    let flush_parts = parts.clone();
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
            let parts = flush_parts.clone();
            async move {
                let mut written = write(&parts.store, &jobs).await?;
                announce(&parts, &mut written).await;
                Ok(written)
            }
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

/// Announces the jobs a batch created, once for the batch: a wake-up per
/// queue instead of one per request. A job marked `enqueue_failed` is
/// answered as marked.
async fn announce(parts: &Parts, written: &mut [Pass<NewJob, Result<Enqueued, StoreError>>]) {
    let mut new = NewJobs::default();
    for pass in written.iter() {
        if let Pass::Answer(Ok(e)) = pass
            && e.created
        {
            new.add(e.job.id, &e.job.queue, e.job.state, e.job.priority, e.job.run_at);
        }
    }
    let marked = new.announce(&parts.wake, &parts.store, &parts.metrics).await;
    if marked.is_empty() {
        return;
    }
    for pass in written.iter_mut() {
        if let Pass::Answer(Ok(e)) = pass
            && marked.contains(&e.job.id)
        {
            e.job.state = JobState::EnqueueFailed;
        }
    }
}
