//! Wake-ups: how parked claims and job reads learn, without polling hard,
//! that looking at PostgreSQL again is worth it. Signals are hints; every
//! waiter also re-checks on a timer.
//!
//! - [`local`]: broadcast channels inside one coordinator.
//! - [`redis`]: the same signals between coordinators, over Redis pub/sub.
//! - [`repair`]: re-sends the wake-ups of `enqueue_failed` jobs.

pub mod local;
pub mod redis;
pub mod repair;

use std::sync::Arc;

use runlease_protocol::{JobId, QueueName};
use tokio::sync::broadcast;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use local::{LocalWake, every, every_paced, jittered, next_job_wake, next_queue_wake};

use crate::metrics::Metrics;
use crate::store::floors::{ClaimFloors, ClaimKey};
use redis::{PublishError, RedisLink};

/// Best-effort signals waiting to be published (terminal jobs, releases).
const OUTBOX_CAPACITY: usize = 10_000;

/// Most outbox signals one Redis message carries (a message of 500 job ids
/// is about 18 kB).
const OUTBOX_BATCH: usize = 500;

/// A best-effort signal for the outbox.
#[derive(Debug)]
enum Signal {
    Queue(QueueName),
    Terminal(JobId),
}

/// How Redis is doing, for `/readyz`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisStatus {
    /// `RUNLEASE_REDIS_URL` is empty: one coordinator, local wake-ups only.
    Disabled,
    /// Subscribed, and publishes go through.
    Ok,
    /// Down or reconnecting: waiters fall back to timers; enqueues are marked
    /// `enqueue_failed` and repaired later.
    Degraded,
}

impl RedisStatus {
    /// As `/readyz` reports it.
    pub fn as_str(self) -> &'static str {
        match self {
            RedisStatus::Disabled => "disabled",
            RedisStatus::Ok => "ok",
            RedisStatus::Degraded => "degraded",
        }
    }
}

/// The wake-ups of one coordinator: local channels plus, when configured, Redis.
#[derive(Clone)]
pub struct Wake {
    local: LocalWake,
    redis: Option<Arc<RedisLink>>,
    outbox: Option<mpsc::Sender<Signal>>,
    metrics: Option<Arc<Metrics>>,
}

impl Default for Wake {
    fn default() -> Self {
        Self::local_only()
    }
}

impl Wake {
    /// Wake-ups inside this process only.
    pub fn local_only() -> Self {
        Self {
            local: LocalWake::new(),
            redis: None,
            outbox: None,
            metrics: None,
        }
    }

    /// Wake-ups through Redis at `url` (channels under `prefix`), with the
    /// subscriber and the outbox publisher spawned on `tracker` until `cancel`.
    pub fn with_redis(
        url: &str,
        prefix: &str,
        metrics: Arc<Metrics>,
        tracker: &TaskTracker,
        cancel: CancellationToken,
    ) -> Result<Self, String> {
        let link = Arc::new(RedisLink::new(url, prefix)?);
        let local = LocalWake::new();
        // Until subscribed, other coordinators' wake-ups do not reach
        // this one: no claim floors.
        local.claim_floors().hearing(false);
        tracker.spawn({
            let link = link.clone();
            let local = local.clone();
            let cancel = cancel.clone();
            async move { link.subscribe(local, cancel).await }
        });
        let (tx, mut rx) = mpsc::channel::<Signal>(OUTBOX_CAPACITY);
        tracker.spawn({
            let link = link.clone();
            let metrics = metrics.clone();
            async move {
                // Whatever waits in the outbox goes out together: one message
                // per channel for up to OUTBOX_BATCH signals (each queue once),
                // so the publisher keeps up with any finish rate instead of
                // paying a Redis round trip per job.
                let mut signals = Vec::with_capacity(OUTBOX_BATCH);
                loop {
                    signals.clear();
                    let got = tokio::select! {
                        n = rx.recv_many(&mut signals, OUTBOX_BATCH) => n,
                        () = cancel.cancelled() => return,
                    };
                    if got == 0 {
                        return;
                    }
                    let mut queues: Vec<QueueName> = Vec::new();
                    // Queue signals before duplicates are dropped: a failed
                    // publish counts every wake-up it carried.
                    let mut queue_signals = 0u64;
                    let mut jobs: Vec<JobId> = Vec::new();
                    for signal in signals.drain(..) {
                        match signal {
                            Signal::Queue(q) => {
                                queue_signals += 1;
                                if !queues.contains(&q) {
                                    queues.push(q);
                                }
                            }
                            Signal::Terminal(id) => jobs.push(id),
                        }
                    }
                    if !queues.is_empty() && link.publish_queues(&queues).await.is_err() {
                        metrics.redis_publish_failures.inc_by(queue_signals);
                    }
                    if !jobs.is_empty() && link.publish_terminals(&jobs).await.is_err() {
                        metrics.redis_publish_failures.inc_by(jobs.len() as u64);
                    }
                }
            }
        });
        Ok(Self {
            local,
            redis: Some(link),
            outbox: Some(tx),
            metrics: Some(metrics),
        })
    }

    /// The claim floors every queue wake-up passes (see
    /// [`crate::store::floors`]).
    pub fn claim_floors(&self) -> Arc<ClaimFloors> {
        self.local.claim_floors()
    }

    /// Redis's state.
    pub fn redis_status(&self) -> RedisStatus {
        match &self.redis {
            None => RedisStatus::Disabled,
            Some(link) if link.healthy() => RedisStatus::Ok,
            Some(_) => RedisStatus::Degraded,
        }
    }

    /// Subscribe to queue wake-ups (`None`: every queue).
    pub fn subscribe_queues(&self) -> broadcast::Receiver<Option<QueueName>> {
        self.local.subscribe_queues()
    }

    /// Subscribe to terminal-job wake-ups (`None`: every job).
    pub fn subscribe_jobs(&self) -> broadcast::Receiver<Option<JobId>> {
        self.local.subscribe_jobs()
    }

    /// Jobs were enqueued on `queues`: wakes local claims and publishes to
    /// every coordinator, waiting for Redis. An error means the signal did
    /// not go out: the caller marks the jobs `enqueue_failed`.
    pub async fn enqueued(&self, queues: &[QueueName]) -> Result<(), PublishError> {
        for queue in queues {
            self.local.queue_ready(queue);
        }
        self.publish_enqueued(queues.iter()).await
    }

    /// [`Wake::enqueued`] where each queue comes with the key of its first
    /// job in claim order (an enqueue answers it): the queue's claim floor
    /// is lowered to it instead of dropped.
    pub async fn enqueued_at(&self, queues: &[(QueueName, ClaimKey)]) -> Result<(), PublishError> {
        self.enqueued_at_served(queues, &[], &[]).await
    }

    /// [`Wake::enqueued_at`] where the claims parked here on `served`
    /// need no wake-up (the enqueue's own claims took every job of those
    /// queues they could): their floors are lowered, and other
    /// coordinators told, all the same. On `whole` the claims took every
    /// job the enqueue created: nothing there became claimable, and the
    /// read after those claims, in the same transaction, left the queue's
    /// floor and empty mark where they belong; only other coordinators are
    /// told.
    pub async fn enqueued_at_served(
        &self,
        queues: &[(QueueName, ClaimKey)],
        served: &[QueueName],
        whole: &[QueueName],
    ) -> Result<(), PublishError> {
        for (queue, key) in queues {
            if whole.contains(queue) {
                continue;
            }
            if served.contains(queue) {
                self.local.queue_written_at(queue, *key);
            } else {
                self.local.queue_ready_at(queue, *key);
            }
        }
        self.publish_enqueued(queues.iter().map(|(q, _)| q)).await
    }

    async fn publish_enqueued(&self, queues: impl Iterator<Item = &QueueName>) -> Result<(), PublishError> {
        let Some(link) = &self.redis else { return Ok(()) };
        for queue in queues {
            if let Err(e) = link.publish_queue(queue).await {
                if let Some(m) = &self.metrics {
                    m.redis_publish_failures.inc();
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Wakes local claims of `queue` and publishes it to every coordinator,
    /// waiting for Redis (the repair loop).
    pub async fn republish(&self, queue: &QueueName) -> Result<(), PublishError> {
        self.local.queue_ready(queue);
        match &self.redis {
            Some(link) => link.publish_queue(queue).await,
            None => Ok(()),
        }
    }

    /// A job became claimable again on `queue` (release, reap, retry): local
    /// wake-up now, Redis best effort.
    pub fn ready(&self, queue: &QueueName) {
        self.local.queue_ready(queue);
        self.send(Signal::Queue(queue.clone()));
    }

    /// [`Wake::ready`] for a job queued again at `key` in the claim order:
    /// the queue's claim floor is lowered to it instead of dropped.
    pub fn ready_at(&self, queue: &QueueName, key: ClaimKey) {
        self.local.queue_ready_at(queue, key);
        self.send(Signal::Queue(queue.clone()));
    }

    /// Wakes the claims of `queue` parked on this coordinator only (each
    /// coordinator notices a settings change itself).
    pub fn ready_here(&self, queue: &QueueName) {
        self.local.queue_ready(queue);
    }

    /// `job` reached a terminal state: local wake-up now, Redis best effort.
    pub fn terminal(&self, job: JobId) {
        self.local.job_terminal(job);
        self.send(Signal::Terminal(job));
    }

    fn send(&self, signal: Signal) {
        if let Some(outbox) = &self.outbox
            && outbox.try_send(signal).is_err()
            && let Some(m) = &self.metrics
        {
            m.redis_publish_failures.inc();
        }
    }
}
