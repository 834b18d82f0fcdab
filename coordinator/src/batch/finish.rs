//! The batchers that write: [`Finisher`], finishing outcomes of many
//! requests in one statement, with the claims that ride them after it in
//! the same transaction; and [`Renewer`], lease renewals of many requests in
//! one statement. Both are [`Batcher`]s.

use std::sync::Arc;

use runlease_protocol::worker::HeartbeatStatus;
use runlease_protocol::{QueueName, WorkerId};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::claims::{self, ClaimAsk};
use crate::batch::plan::{ClaimPlan, Placement};
use crate::batch::{BatchSettings, Batcher, OrphanFn, Parts, Pass};
use crate::flow::FlowControl;
use crate::metrics::{LimitLabels, Metrics};
use crate::store::leases::{ClaimGroup, Ending, FinishedAndClaimed, LeaseRef, Outcome, Renewal};
use crate::store::rows::ClaimedJob;
use crate::store::{Store, StoreError};

/// The batcher of finishing outcomes: each request's items, written with
/// other requests' items in one statement; a request's claim (a finish that
/// carries one) is made after that statement, in the same transaction.
pub type Finisher = Batcher<FinishWork, FinishDone>;
/// The batcher of heartbeats: each request's renewals, written with other
/// requests' renewals in one statement.
pub type Renewer = Batcher<Vec<Renewal>, Vec<HeartbeatStatus>>;

/// One finish request for the [`Finisher`]: its items are written first; a
/// claim it carries is made after them in the same transaction, and sees
/// what they changed (the protocol's promise: no lease of the claim is
/// handed out before the outcomes it follows are committed). A claim that
/// found no room in its batch comes back as [`FinishWork::Claim`].
#[derive(Debug, Clone)]
pub enum FinishWork {
    /// Write the outcomes, then make the claim, if any.
    Write {
        /// The outcomes to write.
        items: Vec<(LeaseRef, Outcome)>,
        /// The claim to make once they are written.
        claim: Option<ClaimAsk>,
    },
    /// The outcomes are committed (their answers kept): make the claim.
    Claim {
        /// The items' answers, one per item, in order.
        endings: Vec<Ending>,
        /// The claim.
        claim: ClaimAsk,
    },
}

impl FinishWork {
    /// The claim it carries, if any.
    fn claim(&self) -> Option<&ClaimAsk> {
        match self {
            FinishWork::Write { claim, .. } => claim.as_ref(),
            FinishWork::Claim { claim, .. } => Some(claim),
        }
    }

    /// Items to write, then `claim` (at once when there are no items).
    pub fn new(items: Vec<(LeaseRef, Outcome)>, claim: Option<ClaimAsk>) -> Self {
        match claim {
            Some(claim) if items.is_empty() => FinishWork::Claim {
                endings: Vec::new(),
                claim,
            },
            claim => FinishWork::Write { items, claim },
        }
    }
}

/// What the [`Finisher`] answers a [`FinishWork`].
#[derive(Debug, Default)]
pub struct FinishDone {
    /// One per item, in order.
    pub endings: Vec<Ending>,
    /// The claim's leases (`None`: the request had no claim; empty: nothing
    /// was claimable, or the coordinator is stopping).
    pub leases: Option<Vec<ClaimedJob>>,
    /// The claiming worker.
    pub worker: Option<WorkerId>,
}

/// Hands each request, in order, its share of the answers to a batch of
/// flattened items (`sizes[i]` items came from request `i`).
fn split<T>(sizes: &[usize], answers: Vec<T>) -> Vec<Vec<T>> {
    let mut answers = answers.into_iter();
    sizes
        .iter()
        .map(|n| answers.by_ref().take(*n).collect())
        .collect()
}

impl Finisher {
    /// Writes finishing outcomes, and the claims riding on them, with
    /// [`Store::finish_then_claim_limited`]: a batch writes its requests'
    /// items, then makes their claims (and those of requests left over from
    /// an earlier batch) in the same transaction. Claims go by (queues,
    /// time left), each one statement of at most `settings.max_size` slots;
    /// claimers left over wait for the next batch. Leases claimed for a
    /// requester that left are released.
    pub fn finisher(
        parts: &Parts,
        settings: BatchSettings,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let Parts {
            store,
            wake,
            flow,
            metrics,
        } = parts;
        let max_slots = settings.max_size.max(1);
        let orphaned: Arc<OrphanFn<FinishDone>> = {
            let (store, wake, tracker) = (store.clone(), wake.clone(), tracker.clone());
            Arc::new(move |done: FinishDone| {
                let (Some(worker), Some(rows)) = (done.worker, done.leases) else {
                    return;
                };
                if rows.is_empty() {
                    return;
                }
                let (store, wake) = (store.clone(), wake.clone());
                tracker.spawn(async move { claims::release_unwanted(&store, &wake, &worker, rows).await });
            })
        };
        let (store, flow) = (store.clone(), flow.clone());
        let stopping = cancel.clone();
        let batch_metrics = metrics.clone();
        Batcher::spawn(
            "finish",
            settings,
            metrics.clone(),
            tracker,
            cancel,
            Some(orphaned),
            move |works: Arc<Vec<FinishWork>>| {
                let (store, flow, stopping, metrics) = (
                    store.clone(),
                    flow.clone(),
                    stopping.clone(),
                    batch_metrics.clone(),
                );
                async move { flush_finishes(&store, &flow, &metrics, &stopping, max_slots, &works).await }
            },
        )
    }
}

/// One batch of the [`Finisher`] (see [`Finisher::finisher`]): the items
/// of its requests, then their claims, in one transaction; a claim of a
/// queue with flow-control limits (an endpoint's queue among them) takes
/// the limited path in it. At shutdown no claim is made (as parked claims
/// are answered then: empty).
async fn flush_finishes(
    store: &Store,
    flow: &FlowControl,
    metrics: &Metrics,
    stopping: &CancellationToken,
    max_slots: usize,
    works: &[FinishWork],
) -> Result<Vec<Pass<FinishWork, FinishDone>>, StoreError> {
    let items: Vec<&(LeaseRef, Outcome)> = works
        .iter()
        .flat_map(|w| match w {
            FinishWork::Write { items, .. } => items.as_slice(),
            FinishWork::Claim { .. } => &[],
        })
        .collect();
    let mut plan = ClaimPlan::new(max_slots);
    let placements: Vec<Option<Placement>> = works
        .iter()
        .map(|w| match w.claim() {
            Some(claim) if !stopping.is_cancelled() => plan.place(claim),
            _ => None,
        })
        .collect();
    let claims = plan.claims();
    for claim in &claims {
        metrics.batch("claim", claim.slots.len());
    }
    let limited: Vec<Vec<QueueName>> = claims.iter().map(|c| flow.limited(c.queues)).collect();
    let (endings, claimed, held_back) = write_batch(store, &items, &claims, &limited).await?;
    for (queue, kind, _) in &held_back {
        let labels = LimitLabels {
            queue: queue.to_string(),
            limit: kind.as_str().to_owned(),
        };
        metrics.claims_held_back.get_or_create(&labels).inc();
    }
    let mut endings = endings.into_iter();
    let mut dealt = plan.deal(claimed);
    Ok(works
        .iter()
        .zip(placements)
        .map(|(work, placement)| {
            let (endings, claim) = match work {
                FinishWork::Write { items, claim } => {
                    (endings.by_ref().take(items.len()).collect(), claim.as_ref())
                }
                FinishWork::Claim { endings, claim } => (endings.clone(), Some(claim)),
            };
            match (claim, placement) {
                (None, _) => Pass::Answer(FinishDone {
                    endings,
                    ..FinishDone::default()
                }),
                (Some(claim), Some(placement)) => Pass::Answer(FinishDone {
                    endings,
                    leases: Some(dealt.take(placement)),
                    worker: Some(claim.worker.clone()),
                }),
                (Some(_), None) if stopping.is_cancelled() => Pass::Answer(FinishDone {
                    endings,
                    leases: Some(Vec::new()),
                    worker: None,
                }),
                // No room in this batch's claim statements: the items are
                // committed, the claim waits for the next batch.
                (Some(claim), None) => Pass::Again(FinishWork::Claim {
                    endings,
                    claim: claim.clone(),
                }),
            }
        })
        .collect())
}

/// One transaction for a batch's items and the claims riding them. Should
/// a claim's limited path fail, the items are written alone and every
/// claim answered empty (its claimer parks or asks again): a limit's
/// trouble never leaves outcomes unwritten.
async fn write_batch(
    store: &Store,
    items: &[&(LeaseRef, Outcome)],
    claims: &[ClaimGroup<'_>],
    limited: &[Vec<QueueName>],
) -> Result<FinishedAndClaimed, StoreError> {
    if items.is_empty() && claims.is_empty() {
        return Ok((Vec::new(), Vec::new(), Vec::new()));
    }
    match store.finish_then_claim_limited(items, claims, limited).await {
        Err(e) if limited.iter().any(|l| !l.is_empty()) => {
            tracing::warn!(error = %e, "a limited claim riding a finish failed: writing the finish alone");
            let endings = if items.is_empty() {
                Vec::new()
            } else {
                store.finish(items).await?
            };
            Ok((endings, vec![Vec::new(); claims.len()], Vec::new()))
        }
        written => written,
    }
}

impl Renewer {
    /// Writes lease renewals with [`Store::heartbeat`].
    pub fn renewer(
        store: &Store,
        settings: BatchSettings,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let store = store.clone();
        Batcher::spawn(
            "heartbeat",
            settings,
            metrics,
            tracker,
            cancel,
            None,
            move |requests: Arc<Vec<Vec<Renewal>>>| {
                let store = store.clone();
                async move {
                    let sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
                    let renewals: Vec<&Renewal> = requests.iter().flatten().collect();
                    let answers = split(&sizes, store.heartbeat(&renewals).await?);
                    Ok(answers.into_iter().map(Pass::Answer).collect())
                }
            },
        )
    }
}
