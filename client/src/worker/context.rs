//! What a handler sees (`JobContext`) and what it returns on failure (`JobError`).

use std::sync::Arc;
use std::time::Duration;

use runlease_protocol::limits::storable_json;
use runlease_protocol::{JobId, QueueName, RunLease};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::worker::lease::Held;

/// One attempt of one job, as its handler sees it.
#[derive(Clone)]
pub struct JobContext {
    pub(crate) job_id: JobId,
    pub(crate) run_lease: RunLease,
    pub(crate) attempt: i32,
    pub(crate) queue: QueueName,
    pub(crate) payload: Value,
    pub(crate) checkpoint: Option<Value>,
    pub(crate) held: Arc<Held>,
}

impl JobContext {
    /// The job's id.
    pub fn job_id(&self) -> JobId {
        self.job_id
    }

    /// This attempt's run lease.
    pub fn run_lease(&self) -> RunLease {
        self.run_lease
    }

    /// `(job_id, run_lease)`: stamp it on side effects outside PostgreSQL (an
    /// idempotency key, a conditional write) so they can refuse a superseded
    /// attempt too.
    pub fn fencing_token(&self) -> (JobId, RunLease) {
        (self.job_id, self.run_lease)
    }

    /// This attempt's number (1-based).
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The job's queue.
    pub fn queue(&self) -> &QueueName {
        &self.queue
    }

    /// The payload as JSON.
    pub fn raw_payload(&self) -> &Value {
        &self.payload
    }

    /// The payload as `T`; a payload that does not fit is a permanent failure.
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, JobError> {
        serde_json::from_value(self.payload.clone())
            .map_err(|e| JobError::permanent(format!("payload does not fit the handler's type: {e}")))
    }

    /// The checkpoint an earlier attempt saved (with progress or a release).
    pub fn checkpoint(&self) -> Option<&Value> {
        self.checkpoint.as_ref()
    }

    /// Saves a checkpoint; it travels with the next heartbeat and is what the
    /// next attempt receives if this one is released or lost.
    pub fn report_progress(&self, progress: impl Serialize) {
        match serde_json::to_value(progress) {
            // PostgreSQL cannot store a NUL: such a checkpoint would make the
            // coordinator refuse the whole heartbeat request.
            Ok(v) if !storable_json(&v) => {
                tracing::warn!(job_id = %self.job_id, "progress holds a NUL character (\\u0000); not saved")
            }
            Ok(v) => self.held.set_progress(v),
            Err(e) => {
                tracing::warn!(job_id = %self.job_id, error = %e, "progress does not serialize; not saved")
            }
        }
    }

    /// Whether the handler should stop: the lease was lost, a cancel was
    /// requested, the timeout passed, the coordinator has been unreachable for
    /// a whole TTL, or the worker is draining or at its deadline.
    pub fn is_cancelled(&self) -> bool {
        self.held.cancel.is_cancelled()
    }

    /// Completes when the handler should stop (see [`JobContext::is_cancelled`]).
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.held.cancel.cancelled()
    }

    /// The cancellation token itself, to hand to code that takes one.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.held.cancel.clone()
    }
}

/// A failed attempt, as a handler reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobError {
    /// What went wrong; recorded on the attempt.
    pub message: String,
    /// Whether another attempt may help.
    pub retryable: bool,
    /// Retry no sooner than this; the coordinator's backoff when `None`.
    pub retry_after: Option<Duration>,
}

impl JobError {
    /// A failure another attempt may fix.
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
            retry_after: None,
        }
    }

    /// A failure no attempt will fix: the job ends `failed`.
    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
            retry_after: None,
        }
    }

    /// Retry no sooner than `delay`.
    pub fn retry_after(mut self, delay: Duration) -> Self {
        self.retry_after = Some(delay);
        self
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for JobError {}

impl From<String> for JobError {
    fn from(message: String) -> Self {
        Self::retryable(message)
    }
}

impl From<&str> for JobError {
    fn from(message: &str) -> Self {
        Self::retryable(message)
    }
}
