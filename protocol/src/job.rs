//! The job as the protocol answers it, its states and its attempt chronology.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{JobId, QueueName, RunLease, WorkerId};

/// Where a job is in its life. Mirrors the PostgreSQL enum `job_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for its dependencies to end; never claimed. Left when the
    /// statement that ends its last dependency moves it on (to `queued`,
    /// or `cancelled` when a dependency failed), or by a cancel.
    Blocked,
    /// Waiting to be claimed (once `run_at` has passed). Left by a claim or a cancel.
    Queued,
    /// Held by a worker under a lease. Left by complete, fail, release, the
    /// reaper (expired lease), or a cancel the worker acknowledges.
    Running,
    /// Completed. Terminal.
    Done,
    /// Out of attempts, or failed as not retryable. Left only by an admin retry.
    Failed,
    /// Cancelled. Left only by an admin retry.
    Cancelled,
    /// Committed, but its wake-up signal could not be sent. Still claimable;
    /// left by the repair loop (to `queued`), a claim or a cancel.
    EnqueueFailed,
}

impl JobState {
    /// Every state, in lifecycle order.
    pub const ALL: [JobState; 7] = [
        JobState::Blocked,
        JobState::Queued,
        JobState::EnqueueFailed,
        JobState::Running,
        JobState::Done,
        JobState::Failed,
        JobState::Cancelled,
    ];

    /// The name used on the wire and in PostgreSQL.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Blocked => "blocked",
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::EnqueueFailed => "enqueue_failed",
        }
    }

    /// Whether nothing but an admin retry moves the job out of this state.
    pub fn is_terminal(self) -> bool {
        matches!(self, JobState::Done | JobState::Failed | JobState::Cancelled)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error for a text that names no job state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownState(pub String);

impl fmt::Display for UnknownState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown job state {:?}", self.0)
    }
}

impl std::error::Error for UnknownState {}

impl FromStr for JobState {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// How one attempt (one run lease) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The worker completed the job.
    Completed,
    /// The worker reported a failure (the job was retried or failed).
    Failed,
    /// The worker gave the job back; no attempt was charged.
    Released,
    /// The lease expired and the reaper took the job back.
    LeaseExpired,
    /// The worker stopped because a cancel was requested.
    Cancelled,
}

impl AttemptOutcome {
    /// The name used on the wire and in PostgreSQL.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Completed => "completed",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Released => "released",
            AttemptOutcome::LeaseExpired => "lease_expired",
            AttemptOutcome::Cancelled => "cancelled",
        }
    }
}

impl FromStr for AttemptOutcome {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            AttemptOutcome::Completed,
            AttemptOutcome::Failed,
            AttemptOutcome::Released,
            AttemptOutcome::LeaseExpired,
            AttemptOutcome::Cancelled,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
        .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// One entry of a job's chronology: one run lease, from claim to its end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The lease this attempt ran under.
    pub run_lease: RunLease,
    /// The worker that claimed it.
    pub worker_id: WorkerId,
    /// When the claim committed.
    #[serde(serialize_with = "crate::time::instant")]
    pub claimed_at: DateTime<Utc>,
    /// When the attempt ended; `None` while it runs.
    #[serde(serialize_with = "crate::time::maybe_instant")]
    pub finished_at: Option<DateTime<Utc>>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<AttemptOutcome>,
    /// The error the worker (or the reaper) recorded.
    pub error: Option<String>,
    /// When the job may start again after this attempt (a failure retried,
    /// or an expired lease); `None` when the attempt did not queue a retry.
    #[serde(default, serialize_with = "crate::time::maybe_instant")]
    pub retry_at: Option<DateTime<Utc>>,
    /// Why the attempt was retried when it was, or why it ended its job: a
    /// code ([`crate::RetryReason`]), `: `, and the numbers that decided it.
    /// `None` for attempts that were not failures (and for a cancel).
    #[serde(default)]
    pub retry_reason: Option<String>,
}

/// A job, as every endpoint that answers one returns it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The job's id (UUIDv7).
    pub id: JobId,
    /// The queue it was enqueued on.
    pub queue: QueueName,
    /// Its state.
    pub state: JobState,
    /// What the producer enqueued.
    pub payload: Value,
    /// Smaller runs first.
    pub priority: i32,
    /// Attempts charged so far (a release gives its charge back).
    pub attempt: i32,
    /// The attempt budget.
    pub max_attempts: i32,
    /// The job's backoff: its own fields, else its queue's when it was
    /// enqueued (absent fields: the coordinator's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<crate::retry::Backoff>,
    /// No retry starts later than this many ms after its first attempt
    /// started (its own, else its queue's when it was enqueued).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_window_ms: Option<i64>,
    /// The latest run lease handed out (0 before the first claim).
    pub run_lease: RunLease,
    /// Not claimable before this instant.
    #[serde(serialize_with = "crate::time::instant")]
    pub run_at: DateTime<Utc>,
    /// When it was enqueued.
    #[serde(serialize_with = "crate::time::instant")]
    pub created_at: DateTime<Utc>,
    /// When any field last changed.
    #[serde(serialize_with = "crate::time::instant")]
    pub updated_at: DateTime<Utc>,
    /// When it reached a terminal state.
    #[serde(serialize_with = "crate::time::maybe_instant")]
    pub finished_at: Option<DateTime<Utc>>,
    /// The run-time limit of one attempt, if the producer set one.
    pub timeout_ms: Option<i64>,
    /// The producer's idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// The job's concurrency key, if any.
    #[serde(default)]
    pub concurrency_key: Option<String>,
    /// The last checkpoint a worker saved.
    pub progress: Option<Value>,
    /// What the completing worker returned.
    pub result: Option<Value>,
    /// The last error recorded.
    pub error: Option<String>,
    /// A cancel was requested while the job was running.
    pub cancel_requested: bool,
    /// The W3C `traceparent` the producer enqueued the job with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<crate::trace::TraceParent>,
    /// The chronology: one entry per run lease, oldest first (absent from
    /// a listing's jobs). At most the latest 100 ended attempts, then the
    /// running one.
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    /// The job has ended attempts older than those in `attempts`: read
    /// them page by page from `GET /v1/jobs/{id}/attempts`.
    #[serde(default)]
    pub earlier_attempts: bool,
    /// What a failed dependency does to the job (absent: it has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_dependency_failure: Option<OnDependencyFailure>,
    /// The jobs it depends on, with their states now (absent from a
    /// listing's jobs; empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<JobLink>,
    /// The jobs that depend on it, with their states now: at most
    /// [`crate::limits::MAX_DEPENDENTS_SHOWN`], oldest first (absent from a
    /// listing's jobs; empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependents: Vec<JobLink>,
}

/// What a dependency that ends `failed` or `cancelled`, or is deleted, does
/// to a job that waits on it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDependencyFailure {
    /// The job is cancelled, its error naming the dependency, and so on
    /// down to the jobs that wait on it.
    #[default]
    Cancel,
    /// The failed dependency counts as met: the job runs anyway.
    Run,
}

impl OnDependencyFailure {
    /// The name used on the wire and in PostgreSQL.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDependencyFailure::Cancel => "cancel",
            OnDependencyFailure::Run => "run",
        }
    }
}

impl FromStr for OnDependencyFailure {
    type Err = UnknownState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cancel" => Ok(OnDependencyFailure::Cancel),
            "run" => Ok(OnDependencyFailure::Run),
            other => Err(UnknownState(other.to_owned())),
        }
    }
}

/// A job a dependency links to, as a job answer shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobLink {
    /// The other job.
    pub id: JobId,
    /// Its state now; `None` once it has been deleted.
    pub state: Option<JobState>,
}

/// One dependency of a leased job, as its lease carries it: each has
/// ended (`done`, or `failed`/`cancelled`/deleted where the job runs
/// anyway).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeaseDependency {
    /// The dependency.
    pub id: JobId,
    /// Its state; `None` once it has been deleted.
    pub state: Option<JobState>,
    /// What it returned, if it is done.
    pub result: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_and_terminality() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>(), Ok(state));
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
        }
        assert!(JobState::Done.is_terminal());
        assert!(JobState::Cancelled.is_terminal());
        assert!(!JobState::EnqueueFailed.is_terminal());
        assert!(!JobState::Blocked.is_terminal());
        assert_eq!("blocked".parse::<JobState>(), Ok(JobState::Blocked));
        assert_eq!("run".parse::<OnDependencyFailure>(), Ok(OnDependencyFailure::Run));
        assert_eq!(OnDependencyFailure::default().as_str(), "cancel");
        assert!("paused".parse::<JobState>().is_err());
    }
}
