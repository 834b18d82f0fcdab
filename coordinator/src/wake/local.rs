//! Wake-ups inside one coordinator: a job became claimable on a queue, or a
//! job reached a terminal state. Waiters subscribe *before* they look at
//! PostgreSQL, so a wake-up sent between their look and their wait is not
//! lost; they also re-check on a timer, so no wake-up is needed for
//! correctness.

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use runlease_protocol::{JobId, QueueName};
use tokio::sync::broadcast;

use crate::store::floors::{ClaimFloors, ClaimKey};

/// Capacity of each broadcast ring; a waiter that lags behind treats it as a wake-up.
const CHANNEL_CAPACITY: usize = 4096;

/// The wake-up channels of one coordinator.
#[derive(Debug, Clone)]
pub struct LocalWake {
    /// `None` wakes the waiters of every queue.
    queues: broadcast::Sender<Option<QueueName>>,
    /// `None` wakes the waiters of every job.
    jobs: broadcast::Sender<Option<JobId>>,
    /// Every queue wake-up passes the claim floors: a job a floor has
    /// passed may have become claimable.
    floors: Arc<ClaimFloors>,
}

impl Default for LocalWake {
    fn default() -> Self {
        Self::new()
    }
}

impl LocalWake {
    /// New channels.
    pub fn new() -> Self {
        Self {
            queues: broadcast::channel(CHANNEL_CAPACITY).0,
            jobs: broadcast::channel(CHANNEL_CAPACITY).0,
            floors: Arc::new(ClaimFloors::new()),
        }
    }

    /// The claim floors these wake-ups keep (the store's claims start
    /// there).
    pub fn claim_floors(&self) -> Arc<ClaimFloors> {
        self.floors.clone()
    }

    /// A job may be claimable on `queue`.
    pub fn queue_ready(&self, queue: &QueueName) {
        self.floors.wrote(queue.as_str(), None);
        // No receivers is fine: nobody is parked.
        let _ = self.queues.send(Some(queue.clone()));
    }

    /// Jobs were enqueued on `queue`, the first of them in claim order at
    /// `key`.
    pub fn queue_ready_at(&self, queue: &QueueName, key: ClaimKey) {
        self.floors.wrote(queue.as_str(), Some(key));
        let _ = self.queues.send(Some(queue.clone()));
    }

    /// Jobs were written on `queue` at `key` and up in the claim order,
    /// and no claim parked here needs to look (the floor is lowered all
    /// the same).
    pub fn queue_written_at(&self, queue: &QueueName, key: ClaimKey) {
        self.floors.wrote(queue.as_str(), Some(key));
    }

    /// `job` reached a terminal state.
    pub fn job_terminal(&self, job: JobId) {
        let _ = self.jobs.send(Some(job));
    }

    /// Every waiter should look again (e.g. signals may have been missed).
    pub fn wake_all(&self) {
        self.floors.forget_all();
        let _ = self.queues.send(None);
        let _ = self.jobs.send(None);
    }

    /// Subscribe to queue wake-ups.
    pub fn subscribe_queues(&self) -> broadcast::Receiver<Option<QueueName>> {
        self.queues.subscribe()
    }

    /// Subscribe to terminal-job wake-ups.
    pub fn subscribe_jobs(&self) -> broadcast::Receiver<Option<JobId>> {
        self.jobs.subscribe()
    }
}

/// `base` scaled by a random factor in [0.75, 1.25], so timers of many
/// waiters do not fire together.
pub fn jittered(base: Duration) -> Duration {
    base.mul_f64(rand::rng().random_range(0.75..1.25))
}

/// How many times as long as a paced pass took [`every_paced`] waits before
/// the next.
const PACE: u32 = 10;

/// The longest wait [`every_paced`] lets a slow pass set (unless the
/// interval itself is longer).
const PACE_MAX: Duration = Duration::from_secs(60);

/// [`every`] for a pass whose cost grows with what vacuum has not removed
/// yet (the claim floors' check: a scan of an index whose dead entries an
/// old snapshot keeps), and whose next run may wait: after a pass that went
/// through (`pass` answers true), the next waits [`PACE`] times as long as
/// it took when that is longer than `interval` (at most [`PACE_MAX`]), so
/// the pass takes about a tenth of one connection however long its scans
/// get. A pass that failed (a timeout, a lost connection) says nothing of
/// its scans: the next comes after `interval`.
pub async fn every_paced<F, Fut>(
    interval: Duration,
    cancel: &tokio_util::sync::CancellationToken,
    mut pass: F,
) where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let mut wait = interval;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(jittered(wait)) => {}
        }
        let started = tokio::time::Instant::now();
        wait = if pass().await {
            (started.elapsed() * PACE).clamp(interval, PACE_MAX.max(interval))
        } else {
            interval
        };
    }
}

/// Runs `pass` every `interval` (jittered) until `cancel` fires: the loop of
/// every background pass (reaper, repair) around its `run_once`.
pub async fn every<F, Fut>(interval: Duration, cancel: &tokio_util::sync::CancellationToken, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(jittered(interval)) => {}
        }
        pass().await;
    }
}

/// Waits until a wake-up for one of `queues` arrives (or the receiver lags,
/// which may have hidden one).
pub async fn next_queue_wake(rx: &mut broadcast::Receiver<Option<QueueName>>, queues: &[QueueName]) {
    loop {
        match rx.recv().await {
            Ok(None) => return,
            Ok(Some(q)) if queues.contains(&q) => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
        }
    }
}

/// Waits until `job` is announced terminal (or the receiver lags).
pub async fn next_job_wake(rx: &mut broadcast::Receiver<Option<JobId>>, job: JobId) {
    loop {
        match rx.recv().await {
            Ok(None) => return,
            Ok(Some(id)) if id == job => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
        }
    }
}
