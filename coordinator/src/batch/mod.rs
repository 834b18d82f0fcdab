//! Batching: many concurrent requests, few statements. Finishing calls and
//! heartbeats go through a [`Batcher`] (group commit: while one batch is being
//! written, the next gathers); parked claims go through the
//! [`claims::ClaimBatcher`], which serves a queue's waiting claimers with one
//! claim statement. A request is answered only after its batch committed,
//! with its own outcome.
//!
//! - [`Batcher`]: the gather-and-flush loop, generic over what it writes.
//! - [`claims`]: the claim batcher.
//! - [`enqueue`]: the batcher of single-job enqueues.
//! - [`finish`]: the batchers of finishing outcomes (with the claims riding them) and of heartbeats.
//! - [`plan`]: [`plan::ClaimPlan`], where the slots of claims go, for every way a claim is made.
//! - `shelf`: the claimers parked in the claim batcher's loops, which the enqueuer may take.

pub mod claims;
pub mod enqueue;
pub mod finish;
pub mod plan;
mod shelf;

pub use enqueue::Enqueuer;
pub use finish::{FinishDone, FinishWork, Finisher, Renewer};

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::{BatchLabels, Metrics};
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

#[cfg(test)]
mod tests;
