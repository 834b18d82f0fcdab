//! The worker runtime: claims jobs for registered handlers, runs them under a
//! concurrency limit, heartbeats every held lease in one request per interval,
//! stops handlers that must stop, and finishes each attempt with one guarded
//! call.
//!
//! A handler is stopped (its [`JobContext`] is cancelled), and the runtime
//! never completes its job, when: the lease is lost or no heartbeat
//! succeeded for a whole lease TTL (self-fencing: a partitioned worker is the
//! one party that cannot be told) — nothing is sent; a cancel was requested —
//! the attempt is failed, which the coordinator records as cancelled; the
//! job's `timeout_ms` passed — the attempt is failed as retryable. A handler
//! stopped because the worker drains or nears its deadline gets the stop
//! grace: a result it returns in time is completed, otherwise the job is
//! released with its last checkpoint (no attempt charged).
//!
//! - [`context`]: `JobContext`, `JobError`.
//! - [`lease`]: the shared state of a held lease and the consumable claimed job.
//! - [`finisher`]: outcomes of concurrent jobs sent together in `POST /v1/finish`.
//! - `heartbeat`: one heartbeat request per interval for every held lease.

pub mod context;
pub mod finisher;
mod heartbeat;
pub mod lease;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runlease_protocol::worker::{ClaimRequest, Lease};
use runlease_protocol::{JobId, QueueName, WorkerId};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
pub use context::{JobContext, JobError};
use finisher::FinishQueue;
use lease::{Claimed, Held, StopReason, is_lease_lost};

/// Default concurrency: jobs run at once by one worker.
pub const DEFAULT_CONCURRENCY: usize = 8;
/// Default claim long-poll.
pub const DEFAULT_CLAIM_WAIT: Duration = Duration::from_secs(30);
/// Default bound on how long a drain lets in-flight jobs finish before releasing them.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time a stopped handler gets to return before it is dropped: less
/// than the release margin, so a release still goes out before a deadline.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(1);
/// Default margin before a hard deadline by which held leases are released.
pub const DEFAULT_RELEASE_MARGIN: Duration = Duration::from_secs(2);
/// Below this much time left before the release margin, deadline mode stops claiming.
const MIN_CLAIM_TIME_LEFT: Duration = Duration::from_millis(500);
/// How long a claim waits for more slots to free up once one has.
const CLAIM_GATHER: Duration = Duration::from_millis(2);
/// In until-idle mode, consecutive failed claims before the worker gives up.
const UNTIL_IDLE_CLAIM_TRIES: u32 = 3;
/// Heartbeat interval before any lease told us the coordinator's.
const FALLBACK_HEARTBEAT: Duration = Duration::from_secs(5);

type HandlerFuture = Pin<Box<dyn Future<Output = std::result::Result<Value, JobError>> + Send>>;
type Handler = Arc<dyn Fn(JobContext) -> HandlerFuture + Send + Sync>;

/// Settings and handlers of a [`Worker`]. Cloning it is cheap (handlers are
/// shared), so one builder can make a worker per Lambda invocation.
#[derive(Clone)]
pub struct WorkerBuilder {
    client: Client,
    worker_id: Option<WorkerId>,
    handlers: HashMap<QueueName, Handler>,
    concurrency: usize,
    claim_wait: Duration,
    drain_timeout: Duration,
    stop_grace: Duration,
    deadline: Option<Instant>,
    release_margin: Duration,
    until_idle: bool,
}

/// What a worker did, counted per attempt outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WorkerReport {
    /// Attempts completed.
    pub completed: u64,
    /// Attempts failed (including those acknowledging a cancel or a timeout).
    pub failed: u64,
    /// Attempts released (drain, deadline).
    pub released: u64,
    /// Attempts dropped without a word (lease lost, fenced, or a finishing
    /// call that could not reach the coordinator).
    pub abandoned: u64,
    /// Claim requests the coordinator answered (with leases or without).
    pub claims_answered: u64,
    /// Claim requests that failed (coordinator unreachable, overloaded, refused).
    pub claims_failed: u64,
}

#[derive(Default)]
struct Counters {
    completed: AtomicU64,
    failed: AtomicU64,
    released: AtomicU64,
    abandoned: AtomicU64,
    claims_answered: AtomicU64,
    claims_failed: AtomicU64,
}

impl Counters {
    fn report(&self) -> WorkerReport {
        WorkerReport {
            completed: self.completed.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            released: self.released.load(Ordering::Relaxed),
            abandoned: self.abandoned.load(Ordering::Relaxed),
            claims_answered: self.claims_answered.load(Ordering::Relaxed),
            claims_failed: self.claims_failed.load(Ordering::Relaxed),
        }
    }
}

fn default_worker_id() -> WorkerId {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "worker".to_owned());
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        .take(64)
        .collect();
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    WorkerId::new(format!(
        "{}-{}-{suffix}",
        if host.is_empty() { "worker" } else { &host },
        std::process::id()
    ))
    .unwrap_or_else(|_| unreachable!("built only from allowed characters"))
}

impl WorkerBuilder {
    /// A worker claiming through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            worker_id: None,
            handlers: HashMap::new(),
            concurrency: DEFAULT_CONCURRENCY,
            claim_wait: DEFAULT_CLAIM_WAIT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            stop_grace: DEFAULT_STOP_GRACE,
            deadline: None,
            release_margin: DEFAULT_RELEASE_MARGIN,
            until_idle: false,
        }
    }

    /// The worker id recorded on every attempt (default: host, pid, random).
    pub fn worker_id(mut self, id: WorkerId) -> Self {
        self.worker_id = Some(id);
        self
    }

    /// Registers the handler of `queue`. It returns a result (completing the
    /// job) or a [`JobError`] (failing the attempt).
    pub fn handle<F, Fut, R>(mut self, queue: QueueName, handler: F) -> Self
    where
        F: Fn(JobContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<R, JobError>> + Send + 'static,
        R: Serialize + 'static,
    {
        let handler = Arc::new(handler);
        let boxed: Handler = Arc::new(move |ctx| {
            let fut = handler(ctx);
            Box::pin(async move {
                let value = fut.await?;
                serde_json::to_value(value)
                    .map_err(|e| JobError::permanent(format!("result does not serialize: {e}")))
            })
        });
        self.handlers.insert(queue, boxed);
        self
    }

    /// Most jobs run at once.
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }

    /// Claim long-poll (at most 60 s).
    pub fn claim_wait(mut self, wait: Duration) -> Self {
        self.claim_wait = wait.min(Duration::from_secs(60));
        self
    }

    /// How long a drain lets in-flight jobs finish before releasing them.
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// How long a stopped handler may take to return before it is dropped.
    pub fn stop_grace(mut self, grace: Duration) -> Self {
        self.stop_grace = grace;
        self
    }

    /// Deadline mode (Lambda): claim only jobs whose timeout fits in the time
    /// left before `deadline`, stop claiming near `deadline - release_margin`,
    /// and release whatever is still held at that point.
    pub fn deadline(mut self, deadline: Instant, release_margin: Duration) -> Self {
        self.deadline = Some(deadline);
        self.release_margin = release_margin;
        self
    }

    /// Stop claiming once a claim comes back empty (the queues are drained),
    /// finish what is held, and return: a Lambda invocation's sweep.
    pub fn until_idle(mut self, yes: bool) -> Self {
        self.until_idle = yes;
        self
    }

    /// The worker.
    pub fn build(self) -> Result<Worker> {
        if self.handlers.is_empty() {
            return Err(Error::Config("a worker needs at least one handler".into()));
        }
        Ok(Worker {
            inner: Arc::new(Inner {
                client: self.client,
                worker_id: self.worker_id.unwrap_or_else(default_worker_id),
                handlers: self.handlers,
                concurrency: self.concurrency,
                claim_wait: self.claim_wait,
                drain_timeout: self.drain_timeout,
                stop_grace: self.stop_grace,
                deadline: self.deadline,
                release_margin: self.release_margin,
                until_idle: self.until_idle,
                held: Mutex::new(HashMap::new()),
                added: Notify::new(),
                counters: Counters::default(),
            }),
        })
    }
}

struct Inner {
    client: Client,
    worker_id: WorkerId,
    handlers: HashMap<QueueName, Handler>,
    concurrency: usize,
    claim_wait: Duration,
    drain_timeout: Duration,
    stop_grace: Duration,
    deadline: Option<Instant>,
    release_margin: Duration,
    until_idle: bool,
    held: Mutex<HashMap<JobId, Arc<Held>>>,
    /// Signalled when a lease is added, so the heartbeat loop adopts its interval.
    added: Notify,
    counters: Counters,
}

/// A worker: run it until its shutdown token fires (or its deadline nears).
pub struct Worker {
    inner: Arc<Inner>,
}

impl Worker {
    /// Settings for a worker claiming through `client`.
    pub fn builder(client: Client) -> WorkerBuilder {
        WorkerBuilder::new(client)
    }

    /// The worker id.
    pub fn worker_id(&self) -> &WorkerId {
        &self.inner.worker_id
    }

    /// Claims and runs jobs until `shutdown` fires, then drains: stops
    /// claiming, lets in-flight jobs finish within the drain timeout and
    /// releases the rest. In deadline mode it also stops at the deadline.
    pub async fn run(self, shutdown: CancellationToken) -> WorkerReport {
        let inner = self.inner;
        let tracker = TaskTracker::new();
        let stop_claiming = shutdown.child_token();
        let background = CancellationToken::new();

        tracker.spawn(heartbeat::heartbeat_loop(inner.clone(), background.clone()));
        let finisher = FinishQueue::spawn(inner.client.clone(), &tracker, background.clone());
        if let Some(deadline) = inner.deadline {
            let inner = inner.clone();
            let stop_claiming = stop_claiming.clone();
            let background = background.clone();
            tracker.spawn(async move {
                let release_at = deadline.checked_sub(inner.release_margin).unwrap_or(deadline);
                tokio::select! {
                    () = tokio::time::sleep_until(release_at) => {}
                    () = background.cancelled() => return,
                }
                stop_claiming.cancel();
                stop_all(&inner, StopReason::Deadline);
            });
        }

        let jobs = TaskTracker::new();
        claim_loop(&inner, &finisher, &jobs, &stop_claiming).await;

        // Drain: in-flight jobs get the drain bound, then are released.
        jobs.close();
        if tokio::time::timeout(inner.drain_timeout, jobs.wait())
            .await
            .is_err()
        {
            tracing::info!("drain bound reached: releasing the jobs still running");
            stop_all(&inner, StopReason::Drain);
            jobs.wait().await;
        }
        background.cancel();
        tracker.close();
        tracker.wait().await;
        inner.counters.report()
    }
}

fn stop_all(inner: &Inner, reason: StopReason) {
    let held: Vec<Arc<Held>> = inner
        .held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .cloned()
        .collect();
    for h in held {
        h.stop(reason);
    }
}

/// Claims while there are free slots, until `stop` fires.
async fn claim_loop(
    inner: &Arc<Inner>,
    finisher: &FinishQueue,
    jobs: &TaskTracker,
    stop: &CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(inner.concurrency));
    let queues: Vec<QueueName> = inner.handlers.keys().cloned().collect();
    let mut failures = 0u32;
    loop {
        let first = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit { Ok(p) => p, Err(_) => return },
            () = stop.cancelled() => return,
        };
        let mut permits = vec![first];
        // Jobs finished together (one /v1/finish answer) free their slots one
        // task after another, and short jobs finished a moment apart free
        // theirs one finish answer later: gather what frees up within
        // CLAIM_GATHER, so one claim asks for all of it. A worker of long
        // jobs claims at most that much later.
        let gather_until = Instant::now() + CLAIM_GATHER;
        while permits.len() < inner.concurrency {
            while let Ok(p) = slots.clone().try_acquire_owned() {
                permits.push(p);
            }
            if permits.len() >= inner.concurrency {
                break;
            }
            match tokio::time::timeout_at(gather_until, slots.clone().acquire_owned()).await {
                Ok(Ok(p)) => permits.push(p),
                _ => break,
            }
        }

        let mut wait = inner.claim_wait;
        let mut time_left_ms = None;
        if let Some(deadline) = inner.deadline {
            // Claiming stops once the release point is near; the coordinator is
            // told the whole remaining run time, so a job whose timeout fits
            // may still be running at the release point: it is then released
            // (no attempt charged) rather than left to time out.
            let now = Instant::now();
            let release_at = deadline.checked_sub(inner.release_margin).unwrap_or(now);
            let before_release = release_at.saturating_duration_since(now);
            if before_release < MIN_CLAIM_TIME_LEFT {
                tracing::info!("deadline near: no more claims");
                return;
            }
            wait = wait.min(before_release.saturating_sub(MIN_CLAIM_TIME_LEFT));
            let left = deadline.saturating_duration_since(now);
            time_left_ms = Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
        }
        let req = ClaimRequest {
            queues: queues.clone(),
            worker_id: inner.worker_id.clone(),
            max_jobs: u32::try_from(permits.len()).unwrap_or(u32::MAX),
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(0),
            time_left_ms,
        };
        let sent = Instant::now();
        let claim = inner.client.claim(&req);
        tokio::pin!(claim);
        let (answer, stopping) = tokio::select! {
            answer = &mut claim => (answer, false),
            () = stop.cancelled() => {
                // Let the claim in flight answer (bounded): leases it brings
                // back are released at once rather than left to expire.
                match tokio::time::timeout(inner.drain_timeout, &mut claim).await {
                    Ok(answer) => (answer, true),
                    Err(_) => return,
                }
            }
        };
        match answer {
            Ok(answer) => {
                failures = 0;
                inner.counters.claims_answered.fetch_add(1, Ordering::Relaxed);
                if answer.leases.is_empty() && inner.until_idle {
                    tracing::info!("nothing left to claim: stopping (until idle)");
                    return;
                }
                let received = Instant::now();
                for lease in answer.leases {
                    let held = Arc::new(Held::new(&lease, sent, received));
                    if stopping {
                        release_unstarted(inner, finisher, &held, "the worker is stopping").await;
                        continue;
                    }
                    let Some(handler) = inner.handlers.get(&lease.queue).cloned() else {
                        release_unstarted(inner, finisher, &held, "no handler for this queue").await;
                        continue;
                    };
                    let Some(permit) = permits.pop() else {
                        release_unstarted(inner, finisher, &held, "more leases than free slots").await;
                        continue;
                    };
                    inner
                        .held
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(lease.job_id, held.clone());
                    inner.added.notify_one();
                    let inner = inner.clone();
                    let finisher = finisher.clone();
                    // trace_id and traceparent: the producer's trace, which this span joins.
                    let span = tracing::info_span!(
                        "job", job_id = %lease.job_id, run_lease = lease.run_lease.0, queue = %lease.queue,
                        trace_id = lease.traceparent.as_ref().map(|t| t.trace_id()),
                        traceparent = lease.traceparent.as_ref().map(|t| t.as_str()),
                    );
                    jobs.spawn(
                        async move {
                            run_job(&inner, &finisher, handler, lease, held).await;
                            drop(permit);
                        }
                        .instrument(span),
                    );
                }
                if stopping {
                    return;
                }
            }
            Err(e) => {
                failures += 1;
                inner.counters.claims_failed.fetch_add(1, Ordering::Relaxed);
                if inner.until_idle && failures >= UNTIL_IDLE_CLAIM_TRIES {
                    tracing::warn!(error = %e, "claims keep failing: stopping (until idle)");
                    return;
                }
                let delay = RetryPolicy::default().delay(failures.min(6), e.retry_after());
                tracing::warn!(error = %e, ?delay, "claim failed; backing off");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

async fn release_unstarted(inner: &Inner, finisher: &FinishQueue, held: &Held, why: &str) {
    tracing::info!(job_id = %held.job_id, why, "releasing a lease without running it");
    match Claimed::new(finisher.clone(), held)
        .release(held.progress())
        .await
    {
        Ok(()) => inner.counters.released.fetch_add(1, Ordering::Relaxed),
        Err(_) => inner.counters.abandoned.fetch_add(1, Ordering::Relaxed),
    };
}

/// Runs one handler and finishes its attempt as its end requires.
async fn run_job(inner: &Inner, finisher: &FinishQueue, handler: Handler, lease: Lease, held: Arc<Held>) {
    let ctx = JobContext {
        job_id: lease.job_id,
        run_lease: lease.run_lease,
        attempt: lease.attempt,
        queue: lease.queue.clone(),
        payload: lease.payload,
        checkpoint: lease.progress,
        held: held.clone(),
    };
    let timeout = Duration::from_millis(lease.timeout_ms);
    let fut = handler(ctx);
    tokio::pin!(fut);
    let mut outcome = tokio::select! {
        result = &mut fut => Some(result),
        () = held.cancel.cancelled() => None,
        () = tokio::time::sleep_until(held.granted_at + timeout) => { held.stop(StopReason::TimedOut); None }
        () = held.fence_when_unrenewed() => None,
    };
    if outcome.is_none() {
        // Stopped: the handler gets a grace to return, then is dropped.
        outcome = tokio::time::timeout(inner.stop_grace, &mut fut).await.ok();
    }
    inner
        .held
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&lease.job_id);
    let claimed = Claimed::new(finisher.clone(), &held);
    let counters = &inner.counters;

    let finished = match (held.stop_reason(), outcome) {
        // Finished on its own: its outcome stands.
        (None, Some(Ok(result))) => claimed.complete(result).await.map(|()| &counters.completed),
        (None, Some(Err(e))) => claimed
            .fail(e.message, e.retryable, e.retry_after)
            .await
            .map(|()| &counters.failed),
        // Done within the grace of a drain or deadline: the work stands too.
        (Some(StopReason::Drain | StopReason::Deadline), Some(Ok(result))) => {
            claimed.complete(result).await.map(|()| &counters.completed)
        }
        (Some(StopReason::LeaseLost | StopReason::Fenced), _) | (None, None) => {
            claimed.abandon();
            Ok(&counters.abandoned)
        }
        (Some(StopReason::CancelRequested), _) => claimed
            .fail("cancelled: a cancel was requested".into(), false, None)
            .await
            .map(|()| &counters.failed),
        (Some(StopReason::TimedOut), _) => claimed
            .fail(
                format!("attempt exceeded its timeout of {} ms", lease.timeout_ms),
                true,
                None,
            )
            .await
            .map(|()| &counters.failed),
        (Some(StopReason::Drain | StopReason::Deadline), _) => claimed
            .release(held.progress())
            .await
            .map(|()| &counters.released),
    };
    match finished {
        Ok(counter) => {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => {
            counters.abandoned.fetch_add(1, Ordering::Relaxed);
            if is_lease_lost(&e) {
                tracing::info!("the lease was lost before the attempt finished; result discarded");
            } else {
                tracing::warn!(error = %e, "could not finish the attempt; the lease will expire and the job run again");
            }
        }
    }
}
