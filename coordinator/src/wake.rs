//! Local wake-ups inside one coordinator: a job became claimable on a queue,
//! or a job reached a terminal state. Waiters subscribe *before* they look at
//! PostgreSQL, so a wake-up sent between their look and their wait is not
//! lost; they also re-check on a timer, so no wake-up is needed for
//! correctness. (Redis carries the same signals between coordinators.)

use std::time::Duration;

use rand::RngExt;
use runlease_protocol::{JobId, QueueName};
use tokio::sync::broadcast;

/// How often a parked claim re-checks PostgreSQL without a wake-up (before jitter).
pub const CLAIM_RECHECK_INTERVAL: Duration = Duration::from_millis(1000);
/// How often a parked job read re-checks PostgreSQL without a wake-up (before jitter).
pub const JOB_RECHECK_INTERVAL: Duration = Duration::from_millis(1000);

/// Capacity of each broadcast ring; a waiter that lags behind treats it as a wake-up.
const CHANNEL_CAPACITY: usize = 4096;

/// The wake-up channels of one coordinator.
#[derive(Debug, Clone)]
pub struct Wake {
    queues: broadcast::Sender<QueueName>,
    jobs: broadcast::Sender<JobId>,
}

impl Default for Wake {
    fn default() -> Self {
        Self::new()
    }
}

impl Wake {
    /// New channels.
    pub fn new() -> Self {
        Self {
            queues: broadcast::channel(CHANNEL_CAPACITY).0,
            jobs: broadcast::channel(CHANNEL_CAPACITY).0,
        }
    }

    /// A job may be claimable on `queue`.
    pub fn queue_ready(&self, queue: &QueueName) {
        // No receivers is fine: nobody is parked.
        let _ = self.queues.send(queue.clone());
    }

    /// `job` reached a terminal state.
    pub fn job_terminal(&self, job: JobId) {
        let _ = self.jobs.send(job);
    }

    /// Subscribe to queue wake-ups.
    pub fn subscribe_queues(&self) -> broadcast::Receiver<QueueName> {
        self.queues.subscribe()
    }

    /// Subscribe to terminal-job wake-ups.
    pub fn subscribe_jobs(&self) -> broadcast::Receiver<JobId> {
        self.jobs.subscribe()
    }
}

/// `base` scaled by a random factor in [0.75, 1.25], so timers of many
/// waiters do not fire together.
pub fn jittered(base: Duration) -> Duration {
    base.mul_f64(rand::rng().random_range(0.75..1.25))
}

/// Waits until a wake-up for one of `queues` arrives (or the receiver lags,
/// which may have hidden one).
pub async fn next_queue_wake(rx: &mut broadcast::Receiver<QueueName>, queues: &[QueueName]) {
    loop {
        match rx.recv().await {
            Ok(q) if queues.contains(&q) => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
        }
    }
}

/// Waits until `job` is announced terminal (or the receiver lags).
pub async fn next_job_wake(rx: &mut broadcast::Receiver<JobId>, job: JobId) {
    loop {
        match rx.recv().await {
            Ok(id) if id == job => return,
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => return,
            Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
        }
    }
}
