//! [`Enqueuer`]: single-job enqueues of many requests written in one
//! statement and one transaction (group commit), as finishes are. A lone
//! enqueue is written at once; while one batch commits, the next gathers.
//! Each request is answered with its own job once its batch committed and
//! announced (one wake-up per queue for the whole batch, [`NewJobs`]); a
//! repeated idempotency key answers the original, even when the original
//! came in the same batch.

use std::collections::HashSet;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use runlease_protocol::{JobId, JobState, QueueName};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::claims::{ClaimBatcher, TakenClaimer};
use crate::batch::plan::{ClaimPlan, Placement};
use crate::batch::{BatchSettings, Batcher, Parts, Pass};
use crate::flow::FlowControl;
use crate::metrics::{Metrics, QueueLabels};
use crate::store::floors::ClaimKey;
use crate::store::jobs::{Enqueued, NewJob};
use crate::store::rows::ClaimedJob;
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
    /// What the enqueue's own claims took.
    served: Served,
}

/// The queues an enqueue's own claims served, as its announce needs them.
#[derive(Debug, Default)]
pub struct Served {
    /// Queues whose every claimable job the claims took: the claimers
    /// parked here need no wake-up.
    pub queues: Vec<QueueName>,
    /// Queues where the claims took every job the batch created: nothing
    /// there became claimable, so no claimer parked here needs a wake-up
    /// and this coordinator's floor and empty mark of the queue stay as
    /// the claims' own read left them.
    pub whole: Vec<QueueName>,
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
        let (served, whole) = (&self.served.queues, &self.served.whole);
        let Err(e) = wake.enqueued_at_served(&self.queues, served, whole).await else {
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
/// committed ([`NewJobs`]), before its requests are answered. Claimers
/// parked on this coordinator for a queue the batch makes jobs claimable
/// on are served in the batch's transaction, after its insert
/// ([`write_claiming`]). It never waits for company (`max_delay` is for
/// finishes): an enqueue is written at once, or with those that arrived
/// while the batch before it was committing.
pub fn enqueuer(
    parts: &Parts,
    settings: BatchSettings,
    claims: ClaimBatcher,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) -> Enqueuer {
    let flush_parts = parts.clone();
    let max_slots = settings.max_size.max(1);
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
            let claims = claims.clone();
            async move {
                let taken = take_claimers(&claims, &parts.flow, &jobs);
                let (mut written, leases, served) =
                    match write_claiming(&parts, &jobs, &taken, max_slots).await {
                        Ok(done) => done,
                        Err(e) => {
                            taken.into_iter().for_each(|t| claims.put_back(t));
                            return Err(e);
                        }
                    };
                for (claimer, leases) in taken.into_iter().zip(leases) {
                    claims.hand_taken(claimer, leases).await;
                }
                announce(&parts, &mut written, served).await;
                Ok(written)
            }
        },
    )
}

/// Claimers parked for the queues `jobs` make jobs claimable on at once
/// (due now, without dependencies, on queues without flow-control limits),
/// about one lease asked for each such job.
fn take_claimers(claims: &ClaimBatcher, flow: &FlowControl, jobs: &[NewJob]) -> Vec<TakenClaimer> {
    let mut due: Vec<(&QueueName, usize)> = Vec::new();
    let now = jobs
        .iter()
        .filter(|j| j.dependencies.is_none() && j.run_at.is_none() && j.delay_ms.unwrap_or(0) <= 0);
    for job in now {
        match due.iter_mut().find(|(q, _)| *q == &job.queue) {
            Some((_, n)) => *n += 1,
            None => due.push((&job.queue, 1)),
        }
    }
    due.into_iter()
        .filter(|(queue, _)| flow.limited(std::slice::from_ref(*queue)).is_empty())
        .flat_map(|(queue, n)| claims.take_parked(queue, n))
        .collect()
}

/// What a batch's transaction answered: each request's pass, the leases
/// of each taken claimer (in the order taken), and the queues its claims
/// served.
type WrittenClaiming = (
    Vec<Pass<NewJob, Result<Enqueued, StoreError>>>,
    Vec<Vec<ClaimedJob>>,
    Served,
);

/// Writes a batch and, in its transaction, claims for `taken`. A batch
/// written job by job (a value refused) claims nothing: its claimers get no
/// leases and park again.
async fn write_claiming(
    parts: &Parts,
    jobs: &[NewJob],
    taken: &[TakenClaimer],
    max_slots: usize,
) -> Result<WrittenClaiming, StoreError> {
    let mut plan = ClaimPlan::new(max_slots);
    let placements: Vec<Option<Placement>> = taken.iter().map(|t| plan.place(t.ask())).collect();
    // No leases for anybody: the claimers look again, woken by the batch.
    let no_leases = || taken.iter().map(|_| Vec::new()).collect();
    if plan.is_empty() {
        return Ok((write(&parts.store, jobs).await?, no_leases(), Served::default()));
    }
    let claims = plan.claims();
    let (enqueued, claimed) = match parts.store.enqueue_then_claim(jobs, &claims).await {
        Ok((enqueued, Some(claimed))) => (enqueued, claimed),
        // The leases were given back.
        Ok((enqueued, None)) => {
            let written = enqueued.into_iter().map(|e| Pass::Answer(Ok(e))).collect();
            return Ok((written, no_leases(), Served::default()));
        }
        Err(StoreError::Rejected(_)) => {
            return Ok((write(&parts.store, jobs).await?, no_leases(), Served::default()));
        }
        Err(e) => return Err(e),
    };
    parts.metrics.batch("enqueue_claim", plan.slots());
    // A statement that filled fewer slots than it had took every job of
    // its queue it could.
    let queues: Vec<QueueName> = claims
        .iter()
        .zip(&claimed)
        .filter(|(claim, rows)| rows.len() < claim.slots.len())
        .flat_map(|(claim, _)| claim.queues.iter().cloned())
        .collect();
    let leased: HashSet<JobId> = claimed.iter().flatten().map(|(_, c)| c.id).collect();
    let whole = claims
        .iter()
        .flat_map(|claim| claim.queues.iter())
        .filter(|&q| {
            enqueued
                .iter()
                .filter(|e| e.created && e.job.state != JobState::Cancelled && &e.job.queue == q)
                .all(|e| leased.contains(&e.job.id))
        })
        .cloned()
        .collect();
    let served = Served { queues, whole };
    let mut dealt = plan.deal(claimed);
    let leases = placements
        .into_iter()
        .map(|p| p.map(|p| dealt.take(p)).unwrap_or_default())
        .collect();
    let written = enqueued.into_iter().map(|e| Pass::Answer(Ok(e))).collect();
    Ok((written, leases, served))
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
/// queue instead of one per request (on this coordinator, none for the
/// queues its claims served, `served`). A job marked `enqueue_failed` is
/// answered as marked.
async fn announce(parts: &Parts, written: &mut [Pass<NewJob, Result<Enqueued, StoreError>>], served: Served) {
    let mut new = NewJobs {
        served,
        ..NewJobs::default()
    };
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
