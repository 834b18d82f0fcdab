//! Batching: many concurrent requests, few statements. Finishing calls and
//! heartbeats go through a [`Batcher`] (group commit: while one batch is being
//! written, the next gathers); parked claims go through the
//! [`claims::ClaimBatcher`], which serves a queue's waiting claimers with one
//! claim statement. A request is answered only after its batch committed,
//! with its own outcome.
//!
//! - [`Batcher`]: the gather-and-flush loop, generic over what it writes.
//! - [`claims`]: the claim batcher.

pub mod claims;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use runlease_protocol::worker::HeartbeatStatus;

use crate::metrics::{BatchLabels, Metrics};
use crate::store::leases::{Ending, LeaseRef, Outcome, Renewal};
use crate::store::{Store, StoreError};

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
    /// Claim loops, each with one claim statement in flight.
    pub claim_shards: usize,
}

/// Writes one batch and answers each of its requests.
async fn flush_batch<Req, Resp>(name: &str, flush: &FlushFn<Req, Resp>, batch: Vec<Pending<Req, Resp>>) {
    let (reqs, replies): (Vec<Req>, Vec<_>) = batch.into_iter().map(|p| (p.req, p.reply)).unzip();
    let n = reqs.len();
    tracing::trace!(batcher = name, size = n, "flushing a batch");
    match flush(Arc::new(reqs)).await {
        Ok(resps) if resps.len() == n => {
            for (reply, resp) in replies.into_iter().zip(resps) {
                // A requester that went away is fine: its write stands.
                let _ = reply.send(Ok(resp));
            }
        }
        Ok(resps) => {
            let e = StoreError::Database(format!(
                "{name} answered {} results for {n} requests",
                resps.len()
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

struct Pending<Req, Resp> {
    req: Req,
    reply: oneshot::Sender<Result<Resp, StoreError>>,
}

/// Writes a batch. It borrows the requests (shared, so a retry needs no copy).
type FlushFn<Req, Resp> = dyn Fn(Arc<Vec<Req>>) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Resp>, StoreError>> + Send>>
    + Send
    + Sync;

/// Gathers requests and writes them with one `flush` call per batch; `flush`
/// answers one response per request, in order.
pub struct Batcher<Req, Resp> {
    tx: Option<mpsc::UnboundedSender<Pending<Req, Resp>>>,
    flush: Arc<FlushFn<Req, Resp>>,
    /// `runlease_batch_gathering` of this batcher's kind.
    gathering: Gauge,
}

impl<Req, Resp> Clone for Batcher<Req, Resp> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            flush: self.flush.clone(),
            gathering: self.gathering.clone(),
        }
    }
}

impl<Req, Resp> Batcher<Req, Resp>
where
    Req: Send + Sync + 'static,
    Resp: Send + 'static,
{
    /// A batcher writing with `flush`. With batching enabled its loop runs on
    /// `tracker` until every handle is dropped; `cancel` (shutdown) turns the
    /// gathering delay off, so what was gathered is flushed at once.
    pub fn spawn<F, Fut>(
        name: &'static str,
        settings: BatchSettings,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
        flush: F,
    ) -> Self
    where
        F: Fn(Arc<Vec<Req>>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<Resp>, StoreError>> + Send + 'static,
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
                gathering,
            };
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending<Req, Resp>>();
        let f = flush.clone();
        let max_size = settings.max_size.max(1);
        let flushers = Arc::new(Semaphore::new(settings.flushers.max(1)));
        let in_flight = TaskTracker::new();
        let tasks = in_flight.clone();
        let gathered = gathering.clone();
        tracker.spawn(async move {
            while let Some(first) = rx.recv().await {
                // Wait for a free flusher first: requests arriving meanwhile
                // join this batch (group commit).
                let Ok(permit) = flushers.clone().acquire_owned().await else {
                    break;
                };
                let mut batch = vec![first];
                if !settings.max_delay.is_zero() && !cancel.is_cancelled() {
                    let until = Instant::now() + settings.max_delay;
                    while batch.len() < max_size {
                        tokio::select! {
                            p = rx.recv() => match p { Some(p) => batch.push(p), None => break },
                            () = tokio::time::sleep_until(until) => break,
                            () = cancel.cancelled() => break,
                        }
                    }
                }
                while batch.len() < max_size {
                    match rx.try_recv() {
                        Ok(p) => batch.push(p),
                        Err(_) => break,
                    }
                }
                gathered.dec_by(batch.len() as i64);
                let f = f.clone();
                tasks.spawn(async move {
                    flush_batch(name, &*f, batch).await;
                    drop(permit);
                });
            }
            // Every handle is gone: let the last batches commit and answer.
            tasks.close();
            tasks.wait().await;
        });
        drop(in_flight);
        Self {
            tx: Some(tx),
            flush,
            gathering,
        }
    }

    /// Writes `req` with the next batch (or alone, with batching off) and
    /// answers once that batch committed.
    pub async fn submit(&self, req: Req) -> Result<Resp, StoreError> {
        let Some(tx) = &self.tx else {
            let mut resps = (self.flush)(Arc::new(vec![req])).await?;
            return resps
                .pop()
                .ok_or_else(|| StoreError::Database("a flush answered nothing".into()));
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
/// other requests' items in one statement.
pub type Finisher = Batcher<Vec<(LeaseRef, Outcome)>, Vec<Ending>>;
/// The batcher of heartbeats: each request's renewals, written with other
/// requests' renewals in one statement.
pub type Renewer = Batcher<Vec<Renewal>, Vec<HeartbeatStatus>>;

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
    /// Writes finishing outcomes with [`Store::finish`].
    pub fn finisher(
        store: &Store,
        settings: BatchSettings,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Self {
        let store = store.clone();
        Batcher::spawn(
            "finish",
            settings,
            metrics,
            tracker,
            cancel,
            move |requests: Arc<Vec<Vec<(LeaseRef, Outcome)>>>| {
                let store = store.clone();
                async move {
                    let sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
                    let items: Vec<&(LeaseRef, Outcome)> = requests.iter().flatten().collect();
                    Ok(split(&sizes, store.finish(&items).await?))
                }
            },
        )
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
            move |requests: Arc<Vec<Vec<Renewal>>>| {
                let store = store.clone();
                async move {
                    let sizes: Vec<usize> = requests.iter().map(Vec::len).collect();
                    let renewals: Vec<&Renewal> = requests.iter().flatten().collect();
                    Ok(split(&sizes, store.heartbeat(&renewals).await?))
                }
            },
        )
    }
}
