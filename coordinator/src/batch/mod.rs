//! Batching: many concurrent requests, few statements. Finishing calls and
//! heartbeats go through a [`Batcher`] (group commit: while one batch is being
//! written, the next gathers); parked claims go through the
//! [`claims::ClaimBatcher`], which serves a queue's waiting claimers with one
//! claim statement. A request is answered only after its batch committed,
//! with its own outcome.
//!
//! - [`Batcher`]: the gather-and-flush loop, generic over what it writes.
//! - [`claims`]: the claim batcher.
//! - [`plan`]: [`plan::ClaimPlan`], where the slots of claims go, for every way a claim is made.

pub mod claims;
pub mod plan;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use runlease_protocol::worker::HeartbeatStatus;

use runlease_protocol::WorkerId;

use crate::batch::claims::ClaimAsk;
use crate::batch::plan::{ClaimPlan, Placement};
use crate::metrics::{BatchLabels, Metrics};
use crate::store::leases::{Ending, LeaseRef, Outcome, Renewal};
use crate::store::rows::ClaimedJob;
use crate::store::{Store, StoreError};
use crate::wake::Wake;

/// What the batchers work with: the database, wake-ups, the flow-control
/// view and the metrics, handed whole to each.
#[derive(Clone)]
pub struct Parts {
    /// PostgreSQL.
    pub store: Store,
    /// Wake-ups (local, and Redis between coordinators).
    pub wake: Wake,
    /// Which queues have flow-control limits.
    pub flow: Arc<crate::flow::FlowControl>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

/// How requests are gathered.
#[derive(Debug, Clone, Copy)]
pub struct BatchSettings {
    /// Off: every request is its own statement (the per-request mode).
    pub enabled: bool,
    /// Most requests in one batch.
    pub max_size: usize,
    /// How long the first request of a batch may wait for company. Zero (the
    /// default) is pure group commit: a lone request is written at once, and
    /// batches grow only while earlier ones are being written.
    pub max_delay: Duration,
    /// Batches of one kind written at once (each on its own connection).
    pub flushers: usize,
    /// Requests a batch needs before it is written beside a flush already
    /// in flight. Below it the batch waits for that flush to end
    /// (gathering meanwhile): at a few concurrent workers two transactions
    /// at once would each carry half as much and cost PostgreSQL a commit
    /// more; at hundreds the batches pass it at once and the flushes
    /// overlap. 1: any free flusher writes at once.
    pub parallel_min: usize,
    /// Claim loops, each with one claim statement in flight.
    pub claim_shards: usize,
}

/// What a flush makes of one request: its answer, or the request again for
/// a later batch (a second step that must wait for this batch's commit).
#[derive(Debug)]
pub enum Pass<Req, Resp> {
    /// Answered.
    Answer(Resp),
    /// To be written with the next batch, and answered then.
    Again(Req),
}

/// Where a batch's [`Pass::Again`] requests go: back into the batcher's own
/// queue (held weakly, so the loop still ends when every handle is gone).
struct Requeue<Req, Resp> {
    tx: mpsc::WeakUnboundedSender<Pending<Req, Resp>>,
    gathering: Gauge,
}

/// A flusher taken by one flush: given back, and the gather loop told, when
/// the flush ends, however it ends (a panic included), so a batch waiting
/// beside it is never left waiting.
struct FlushSlot {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    flushed: Arc<Notify>,
}

impl Drop for FlushSlot {
    fn drop(&mut self) {
        // The permit first: the loop, once woken, must find it free.
        drop(self.permit.take());
        self.flushed.notify_one();
    }
}

/// Writes one batch and answers each of its requests (or queues it again).
async fn flush_batch<Req, Resp>(
    name: &str,
    flush: &FlushFn<Req, Resp>,
    orphaned: Option<&OrphanFn<Resp>>,
    requeue: &Requeue<Req, Resp>,
    batch: Vec<Pending<Req, Resp>>,
) {
    let (reqs, replies): (Vec<Req>, Vec<_>) = batch.into_iter().map(|p| (p.req, p.reply)).unzip();
    let n = reqs.len();
    tracing::trace!(batcher = name, size = n, "flushing a batch");
    match flush(Arc::new(reqs)).await {
        Ok(passes) if passes.len() == n => {
            let again = requeue.tx.upgrade();
            for (reply, pass) in replies.into_iter().zip(passes) {
                match pass {
                    Pass::Answer(resp) => answer(reply, resp, orphaned),
                    Pass::Again(req) => {
                        // A requester that left needs no second pass; with
                        // the loop gone (every handle dropped), nobody waits
                        // for the answer any more.
                        if reply.is_closed() {
                            continue;
                        }
                        if let Some(tx) = &again {
                            requeue.gathering.inc();
                            if tx.send(Pending { req, reply }).is_err() {
                                requeue.gathering.dec();
                            }
                        }
                    }
                }
            }
        }
        Ok(passes) => {
            let e = StoreError::Database(format!(
                "{name} answered {} results for {n} requests",
                passes.len()
            ));
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// Answers one request; an answer its requester left before is handed to
/// `orphaned` (a requester that went away is fine: its write stands, and
/// what it would have been handed is given back there).
fn answer<Resp>(
    reply: oneshot::Sender<Result<Resp, StoreError>>,
    resp: Resp,
    orphaned: Option<&OrphanFn<Resp>>,
) {
    if let (Err(Ok(resp)), Some(orphaned)) = (reply.send(Ok(resp)), orphaned) {
        orphaned(resp);
    }
}

struct Pending<Req, Resp> {
    req: Req,
    reply: oneshot::Sender<Result<Resp, StoreError>>,
}

/// Writes a batch. It borrows the requests (shared, so a retry needs no copy).
type FlushFn<Req, Resp> = dyn Fn(
        Arc<Vec<Req>>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Pass<Req, Resp>>, StoreError>> + Send>>
    + Send
    + Sync;

/// Takes an answer whose requester went away before it was answered.
pub type OrphanFn<Resp> = dyn Fn(Resp) + Send + Sync;

/// Gathers requests and writes them with one `flush` call per batch; `flush`
/// answers one response per request, in order.
pub struct Batcher<Req, Resp> {
    tx: Option<mpsc::UnboundedSender<Pending<Req, Resp>>>,
    flush: Arc<FlushFn<Req, Resp>>,
    orphaned: Option<Arc<OrphanFn<Resp>>>,
    /// `runlease_batch_gathering` of this batcher's kind.
    gathering: Gauge,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            flush: self.flush.clone(),
            orphaned: self.orphaned.clone(),
            gathering: self.gathering.clone(),
        }
    }
}

/// The loop of a [`Batcher`] with batching on: gathers requests into
/// batches and starts a flush of each.
struct GatherLoop<Req, Resp> {
    name: &'static str,
    rx: mpsc::UnboundedReceiver<Pending<Req, Resp>>,
    /// False once every handle is gone.
    open: bool,
    max_size: usize,
    parallel_min: usize,
    max_delay: Duration,
    flusher_count: usize,
    flushers: Arc<Semaphore>,
    /// Signalled as each flush ends (a stored signal only wakes the loop
    /// once more to look again).
    flushed: Arc<Notify>,
    cancel: CancellationToken,
    flush: Arc<FlushFn<Req, Resp>>,
    orphaned: Option<Arc<OrphanFn<Resp>>>,
    requeue: Arc<Requeue<Req, Resp>>,
    gathering: Gauge,
}

impl<Req, Resp> GatherLoop<Req, Resp>
where
    Req: Send + Sync + 'static,
    Resp: Send + 'static,
{
    /// Runs until every handle is gone, then lets the last batches commit
    /// and answer.
    async fn run(mut self) {
        let in_flight = TaskTracker::new();
        while let Some(first) = self.rx.recv().await {
            let Some((batch, permit)) = self.gather(first).await else {
                break;
            };
            self.gathering.dec_by(batch.len() as i64);
            let (name, f, orphan, requeue) = (
                self.name,
                self.flush.clone(),
                self.orphaned.clone(),
                self.requeue.clone(),
            );
            let slot = FlushSlot {
                permit: Some(permit),
                flushed: self.flushed.clone(),
            };
            in_flight.spawn(async move {
                flush_batch(name, &*f, orphan.as_deref(), &requeue, batch).await;
                drop(slot);
            });
        }
        in_flight.close();
        in_flight.wait().await;
    }

    /// Moves what is queued into `batch`, up to the batch's size.
    fn take_queued(&mut self, batch: &mut Vec<Pending<Req, Resp>>) {
        while self.open && batch.len() < self.max_size {
            match self.rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => self.open = false,
            }
        }
    }

    /// A batch starting with `first` and a flusher to write it. It waits
    /// for a free flusher: requests arriving meanwhile join it (group
    /// commit). With a flush in flight, a second one starts only for a batch
    /// worth a transaction of its own; a smaller one waits for the flush in
    /// flight and keeps gathering (at a few concurrent requests, two
    /// transactions at once would each carry half as much).
    async fn gather(
        &mut self,
        first: Pending<Req, Resp>,
    ) -> Option<(Vec<Pending<Req, Resp>>, tokio::sync::OwnedSemaphorePermit)> {
        let mut batch = vec![first];
        let permit = loop {
            self.take_queued(&mut batch);
            let idle = self.flushers.available_permits() == self.flusher_count;
            if (idle || batch.len() >= self.parallel_min)
                && let Ok(permit) = self.flushers.clone().try_acquire_owned()
            {
                break permit;
            }
            if !self.open {
                // Every handle is gone: this batch still goes out.
                break self.flushers.clone().acquire_owned().await.ok()?;
            }
            tokio::select! {
                () = self.flushed.notified() => {}
                p = self.rx.recv(), if batch.len() < self.max_size => match p {
                    Some(p) => batch.push(p),
                    None => self.open = false,
                },
            }
        };
        if !self.max_delay.is_zero() && !self.cancel.is_cancelled() {
            let until = Instant::now() + self.max_delay;
            while batch.len() < self.max_size {
                tokio::select! {
                    p = self.rx.recv() => match p { Some(p) => batch.push(p), None => break },
                    () = tokio::time::sleep_until(until) => break,
                    () = self.cancel.cancelled() => break,
                }
            }
        }
        while batch.len() < self.max_size {
            match self.rx.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        Some((batch, permit))
    }
}

impl<Req, Resp> Batcher<Req, Resp>
where
    Req: Send + Sync + 'static,
    Resp: Send + 'static,
{
    /// A batcher writing with `flush`, which answers each request or hands
    /// it back for the next batch ([`Pass`]). With batching enabled its loop
    /// runs on `tracker` until every handle is dropped; `cancel` (shutdown)
    /// turns the gathering delay off, so what was gathered is flushed at
    /// once. Answers whose requester left go to `orphaned`.
    pub fn spawn<F, Fut>(
        name: &'static str,
        settings: BatchSettings,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
        orphaned: Option<Arc<OrphanFn<Resp>>>,
        flush: F,
    ) -> Self
    where
        F: Fn(Arc<Vec<Req>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Pass<Req, Resp>>, StoreError>> + Send + 'static,
    {
        let gathering = metrics
            .batch_gathering
            .get_or_create(&BatchLabels {
                kind: name.to_owned(),
            })
            .clone();
        let flush: Arc<FlushFn<Req, Resp>> = Arc::new(move |reqs: Arc<Vec<Req>>| {
            metrics.batch(name, reqs.len());
            Box::pin(flush(reqs))
        });
        if !settings.enabled {
            return Self {
                tx: None,
                flush,
                orphaned,
                gathering,
            };
        }
        let (tx, rx) = mpsc::unbounded_channel::<Pending<Req, Resp>>();
        let max_size = settings.max_size.max(1);
        let flusher_count = settings.flushers.max(1);
        let gather = GatherLoop {
            name,
            rx,
            open: true,
            max_size,
            // A batch never holds more than max_size requests.
            parallel_min: settings.parallel_min.clamp(1, max_size),
            max_delay: settings.max_delay,
            flusher_count,
            flushers: Arc::new(Semaphore::new(flusher_count)),
            flushed: Arc::new(Notify::new()),
            cancel,
            flush: flush.clone(),
            orphaned: orphaned.clone(),
            requeue: Arc::new(Requeue {
                tx: tx.downgrade(),
                gathering: gathering.clone(),
            }),
            gathering: gathering.clone(),
        };
        tracker.spawn(gather.run());
        Self {
            tx: Some(tx),
            flush,
            orphaned,
            gathering,
        }
    }

    /// Whether requests are gathered into batches (off: each is written
    /// alone, at once).
    pub fn batching(&self) -> bool {
        self.tx.is_some()
    }

    /// Writes `req` with the next batch (or alone, with batching off) and
    /// answers once that batch committed.
    pub async fn submit(&self, req: Req) -> Result<Resp, StoreError> {
        let Some(tx) = &self.tx else {
            // Alone: each pass is its own flush.
            let mut req = req;
            loop {
                match (self.flush)(Arc::new(vec![req])).await?.pop() {
                    Some(Pass::Answer(resp)) => return Ok(resp),
                    Some(Pass::Again(next)) => req = next,
                    None => return Err(StoreError::Database("a flush answered nothing".into())),
                }
            }
        };
        let (reply, answer) = oneshot::channel();
        // Counted before the send, so the loop's decrement never comes first.
        self.gathering.inc();
        tx.send(Pending { req, reply }).map_err(|_| {
            self.gathering.dec();
            StoreError::Unavailable("the coordinator is shutting down".into())
        })?;
        answer
            .await
            .map_err(|_| StoreError::Unavailable("the coordinator is shutting down".into()))?
    }
}

/// The batcher of finishing outcomes: each request's items, written with
/// other requests' items in one statement; a request's claim (a finish that
/// carries one) rides the next batch's transaction, after the one that
/// committed its items.
pub type Finisher = Batcher<FinishWork, FinishDone>;
/// The batcher of heartbeats: each request's renewals, written with other
/// requests' renewals in one statement.
pub type Renewer = Batcher<Vec<Renewal>, Vec<HeartbeatStatus>>;

/// One finish request for the [`Finisher`], in one of its two passes: its
/// items are written first; a claim it carries is made by a later batch,
/// in a transaction after the one that committed them (the protocol's
/// promise: no lease of the claim is handed out before the outcomes it
/// follows).
#[derive(Debug, Clone)]
pub enum FinishWork {
    /// Write the outcomes; a claim, if any, then rides the next batch.
    Write {
        /// The outcomes to write.
        items: Vec<(LeaseRef, Outcome)>,
        /// The claim to make once they are committed.
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
    /// [`Store::finish_then_claim`]: a batch writes its new requests' items
    /// and makes the claims of requests whose items an earlier batch
    /// committed. Claims go by (queues, time left), each one statement of
    /// at most `settings.max_size` slots; claimers left over wait for the
    /// next batch. Leases claimed for a requester that left are released.
    pub fn finisher(
        store: &Store,
        wake: &Wake,
        settings: BatchSettings,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
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
        let store = store.clone();
        let stopping = cancel.clone();
        let batch_metrics = metrics.clone();
        Batcher::spawn(
            "finish",
            settings,
            metrics,
            tracker,
            cancel,
            Some(orphaned),
            move |works: Arc<Vec<FinishWork>>| {
                let (store, stopping, metrics) = (store.clone(), stopping.clone(), batch_metrics.clone());
                async move { flush_finishes(&store, &metrics, &stopping, max_slots, &works).await }
            },
        )
    }
}

/// One batch of the [`Finisher`] (see [`Finisher::finisher`]): the items
/// of its `Write` passes and the claims of its `Claim` passes, in one
/// transaction. At shutdown no claim is made (as parked claims are
/// answered then: empty).
async fn flush_finishes(
    store: &Store,
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
        .map(|w| match w {
            FinishWork::Claim { claim, .. } if !stopping.is_cancelled() => plan.place(claim),
            _ => None,
        })
        .collect();
    let claims = plan.claims();
    for claim in &claims {
        metrics.batch("claim", claim.slots.len());
    }
    // One transaction for the items and the claims riding them.
    let (endings, claimed) = if items.is_empty() && claims.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        store.finish_then_claim(&items, &claims).await?
    };
    let mut endings = endings.into_iter();
    let mut dealt = plan.deal(claimed);
    Ok(works
        .iter()
        .zip(placements)
        .map(|(work, placement)| match work {
            FinishWork::Write { items, claim } => {
                let endings: Vec<Ending> = endings.by_ref().take(items.len()).collect();
                match claim {
                    None => Pass::Answer(FinishDone {
                        endings,
                        ..FinishDone::default()
                    }),
                    // Written: the claim rides the next batch.
                    Some(claim) => Pass::Again(FinishWork::Claim {
                        endings,
                        claim: claim.clone(),
                    }),
                }
            }
            FinishWork::Claim { endings, claim } => match placement {
                Some(placement) => Pass::Answer(FinishDone {
                    endings: endings.clone(),
                    leases: Some(dealt.take(placement)),
                    worker: Some(claim.worker.clone()),
                }),
                None if stopping.is_cancelled() => Pass::Answer(FinishDone {
                    endings: endings.clone(),
                    leases: Some(Vec::new()),
                    worker: None,
                }),
                // No room in this batch's claim statement: the next one.
                None => Pass::Again(work.clone()),
            },
        })
        .collect())
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::sync::Semaphore;

    use super::*;

    fn settings(enabled: bool) -> BatchSettings {
        BatchSettings {
            enabled,
            max_size: 100,
            max_delay: Duration::ZERO,
            flushers: 1,
            parallel_min: 1,
            claim_shards: 1,
        }
    }

    /// What each flush was handed, in order.
    type Seen = Arc<Mutex<Vec<Vec<(u32, u32)>>>>;

    fn metrics() -> Arc<Metrics> {
        Arc::new(Metrics::new(Duration::from_secs(25)))
    }

    /// A batcher of `(id, passes left)` requests answered with `id`.
    type TestBatcher = Batcher<(u32, u32), u32>;

    /// A [`TestBatcher`] that is never cancelled.
    fn spawn_test<F, Fut>(
        settings: BatchSettings,
        tracker: &TaskTracker,
        orphaned: Option<Arc<OrphanFn<u32>>>,
        flush: F,
    ) -> TestBatcher
    where
        F: Fn(Arc<Vec<(u32, u32)>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Pass<(u32, u32), u32>>, StoreError>> + Send + 'static,
    {
        Batcher::spawn(
            "test",
            settings,
            metrics(),
            tracker,
            CancellationToken::new(),
            orphaned,
            flush,
        )
    }

    /// A request `(id, passes left)`: answered `id` once no pass is left,
    /// else handed back with one pass less.
    fn pass((id, left): (u32, u32)) -> Pass<(u32, u32), u32> {
        if left == 0 {
            Pass::Answer(id)
        } else {
            Pass::Again((id, left - 1))
        }
    }

    #[tokio::test]
    async fn a_request_handed_back_is_answered_by_a_later_batch_with_requests_that_came_meanwhile() {
        let tracker = TaskTracker::new();
        let batches: Seen = Arc::default();
        // The first flush waits at the gate until every request is queued.
        let gate = Arc::new(Semaphore::new(0));
        let (seen, opened) = (batches.clone(), gate.clone());
        let batcher = spawn_test(
            settings(true),
            &tracker,
            None,
            move |reqs: Arc<Vec<(u32, u32)>>| {
                let (seen, opened) = (seen.clone(), opened.clone());
                async move {
                    let first = seen.lock().unwrap().is_empty();
                    seen.lock().unwrap().push(reqs.to_vec());
                    if first {
                        opened.acquire().await.unwrap().forget();
                    }
                    Ok(reqs.iter().copied().map(pass).collect())
                }
            },
        );
        // Request 0 (two passes) is flushed alone and held at the gate;
        // 1 (one pass) and 2 (none) queue meanwhile.
        let first = tokio::spawn({
            let b = batcher.clone();
            async move { b.submit((0, 2)).await }
        });
        while batches.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        let (b1, b2) = (batcher.clone(), batcher.clone());
        let others = tokio::spawn(async move { tokio::join!(b1.submit((1, 1)), b2.submit((2, 0))) });
        while batcher.gathering.get() < 2 {
            tokio::task::yield_now().await;
        }
        gate.add_permits(1);
        assert_eq!(first.await.unwrap().unwrap(), 0);
        let (one, two) = others.await.unwrap();
        assert_eq!((one.unwrap(), two.unwrap()), (1, 2));
        let batches = batches.lock().unwrap().clone();
        // 0's second pass went with the two that queued during its first;
        // each later pass is in a later batch than the one before it.
        assert_eq!(batches[0], vec![(0, 2)]);
        assert!(
            batches[1].contains(&(1, 1)) && batches[1].contains(&(2, 0)),
            "{batches:?}"
        );
        assert!(batches[1].contains(&(0, 1)), "{batches:?}");
        let at = |req| batches.iter().position(|b| b.contains(&req)).unwrap();
        assert!(at((0, 0)) > at((0, 1)) && at((1, 0)) > at((1, 1)), "{batches:?}");
        assert_eq!(batcher.gathering.get(), 0, "the gauge counts what waits");
    }

    /// A batcher of two flushers whose flushes log their start and end and
    /// hold at `gate` while it is closed.
    fn gated(
        parallel_min: usize,
        tracker: &TaskTracker,
        gate: Arc<Semaphore>,
        log: Arc<Mutex<Vec<String>>>,
    ) -> TestBatcher {
        let mut s = settings(true);
        s.flushers = 2;
        s.parallel_min = parallel_min;
        spawn_test(s, tracker, None, move |reqs: Arc<Vec<(u32, u32)>>| {
            let (gate, log) = (gate.clone(), log.clone());
            async move {
                let ids: Vec<u32> = reqs.iter().map(|r| r.0).collect();
                log.lock().unwrap().push(format!("start {ids:?}"));
                gate.acquire().await.unwrap().forget();
                log.lock().unwrap().push(format!("end {ids:?}"));
                Ok(reqs.iter().copied().map(pass).collect())
            }
        })
    }

    async fn until(check: impl Fn() -> bool) {
        while !check() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn beside_a_flush_in_flight_a_second_starts_only_once_its_batch_is_large_enough() {
        let tracker = TaskTracker::new();
        let gate = Arc::new(Semaphore::new(0));
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let batcher = gated(3, &tracker, gate.clone(), log.clone());
        let submit = |id| {
            let b = batcher.clone();
            tokio::spawn(async move { b.submit((id, 0)).await })
        };
        let mut answers = vec![submit(0)];
        until(|| log.lock().unwrap().len() == 1).await;
        // Two requests, fewer than 3: they wait beside the flush in flight.
        answers.push(submit(1));
        until(|| batcher.gathering.get() == 1).await;
        answers.push(submit(2));
        until(|| batcher.gathering.get() == 2).await;
        // The third makes the batch large enough: a second flush starts
        // with all three while the first is still held.
        answers.push(submit(3));
        until(|| log.lock().unwrap().len() == 2).await;
        assert_eq!(*log.lock().unwrap(), vec!["start [0]", "start [1, 2, 3]"]);
        gate.add_permits(2);
        for (id, answer) in answers.into_iter().enumerate() {
            assert_eq!(answer.await.unwrap().unwrap(), id as u32);
        }
    }

    #[tokio::test]
    async fn a_small_batch_waits_for_the_flush_in_flight_then_goes() {
        let tracker = TaskTracker::new();
        let gate = Arc::new(Semaphore::new(0));
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let batcher = gated(10, &tracker, gate.clone(), log.clone());
        let b = batcher.clone();
        let first = tokio::spawn(async move { b.submit((0, 0)).await });
        until(|| log.lock().unwrap().len() == 1).await;
        let b = batcher.clone();
        let second = tokio::spawn(async move { b.submit((1, 0)).await });
        until(|| batcher.gathering.get() == 1).await;
        // A free flusher, but a batch of one beside a flush in flight: it
        // waits, and goes once that flush has ended.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(*log.lock().unwrap(), vec!["start [0]"]);
        gate.add_permits(2);
        assert_eq!(first.await.unwrap().unwrap(), 0);
        assert_eq!(second.await.unwrap().unwrap(), 1);
        assert_eq!(
            *log.lock().unwrap(),
            vec!["start [0]", "end [0]", "start [1]", "end [1]"]
        );
    }

    #[tokio::test]
    async fn alone_each_pass_is_its_own_flush() {
        let tracker = TaskTracker::new();
        let flushes: Seen = Arc::default();
        let seen = flushes.clone();
        let batcher = spawn_test(
            settings(false),
            &tracker,
            None,
            move |reqs: Arc<Vec<(u32, u32)>>| {
                seen.lock().unwrap().push(reqs.to_vec());
                std::future::ready(Ok(reqs.iter().copied().map(pass).collect()))
            },
        );
        assert!(!batcher.batching());
        assert_eq!(batcher.submit((7, 2)).await.unwrap(), 7);
        assert_eq!(
            *flushes.lock().unwrap(),
            vec![vec![(7, 2)], vec![(7, 1)], vec![(7, 0)]]
        );
    }

    #[tokio::test]
    async fn an_answer_whose_requester_left_goes_to_the_orphan_hook() {
        let tracker = TaskTracker::new();
        let gate = Arc::new(Semaphore::new(0));
        let orphans: Arc<Mutex<Vec<u32>>> = Arc::default();
        let kept = orphans.clone();
        let opened = gate.clone();
        let (flushing, mut flushed) = mpsc::unbounded_channel::<()>();
        let batcher = spawn_test(
            settings(true),
            &tracker,
            Some(Arc::new(move |id| kept.lock().unwrap().push(id))),
            move |reqs: Arc<Vec<(u32, u32)>>| {
                let (opened, flushing) = (opened.clone(), flushing.clone());
                async move {
                    let _ = flushing.send(());
                    opened.acquire().await.unwrap().forget();
                    Ok(reqs.iter().copied().map(pass).collect())
                }
            },
        );
        let b = batcher.clone();
        let left = tokio::spawn(async move { b.submit((9, 0)).await });
        flushed.recv().await.unwrap();
        left.abort();
        assert!(left.await.unwrap_err().is_cancelled());
        gate.add_permits(1);
        // A second request is flushed only once the first flush answered.
        let b = batcher.clone();
        let next = tokio::spawn(async move { b.submit((10, 0)).await });
        flushed.recv().await.unwrap();
        gate.add_permits(1);
        assert_eq!(next.await.unwrap().unwrap(), 10);
        assert_eq!(*orphans.lock().unwrap(), vec![9]);
    }
}
