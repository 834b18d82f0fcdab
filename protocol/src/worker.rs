//! Requests and answers of the worker endpoints.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::ids::{JobId, LeaseToken, QueueName, RunLease, WorkerId};
use crate::job::JobState;
use crate::trace::TraceParent;

fn default_max_jobs() -> u32 {
    1
}

fn default_true() -> bool {
    true
}

/// `POST /v1/claim`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Queues to claim from (1 to 100).
    pub queues: Vec<QueueName>,
    /// Who is claiming; recorded on the attempt and in the token.
    pub worker_id: WorkerId,
    /// Most leases to hand out (1..=1000, default 1).
    #[serde(default = "default_max_jobs")]
    pub max_jobs: u32,
    /// Long-poll for up to this many ms when nothing is claimable (0..=60000).
    #[serde(default)]
    pub wait_ms: u64,
    /// The worker's remaining run time: only jobs whose timeout fits are handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_left_ms: Option<u64>,
}

/// Answer to `POST /v1/claim`: possibly empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimResponse {
    /// The leases handed out.
    pub leases: Vec<Lease>,
}

/// One claimed job and the lease that proves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The job.
    pub job_id: JobId,
    /// The fencing counter of this attempt.
    pub run_lease: RunLease,
    /// Pass it back on every heartbeat and finishing call.
    pub lease_token: LeaseToken,
    /// The job's queue.
    pub queue: QueueName,
    /// The job's payload.
    pub payload: Value,
    /// This attempt's number (1-based).
    pub attempt: i32,
    /// The checkpoint an earlier attempt saved.
    pub progress: Option<Value>,
    /// The lease lapses this many ms after the claim or the last heartbeat.
    pub lease_ttl_ms: u64,
    /// Heartbeat this often.
    pub heartbeat_interval_ms: u64,
    /// The attempt must end within this many ms of the claim.
    pub timeout_ms: u64,
    /// The W3C `traceparent` the producer enqueued the job with, if any:
    /// the worker's span for this job joins that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<TraceParent>,
    /// The job's dependencies, each ended, with its state and result
    /// (absent: the job has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<crate::job::LeaseDependency>,
}

/// `POST /v1/heartbeat`: renew many leases at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// The leases to renew (1 to 1000).
    pub leases: Vec<HeartbeatItem>,
}

/// One lease to renew.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatItem {
    /// The lease.
    pub lease_token: LeaseToken,
    /// A checkpoint to save; absent or null keeps the previous one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// Answer to `POST /v1/heartbeat`, one entry per item, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatResponse {
    /// Per-lease outcomes.
    pub leases: Vec<HeartbeatResult>,
}

/// The outcome for one lease of a heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatResult {
    /// The job.
    pub job_id: JobId,
    /// The lease.
    pub run_lease: RunLease,
    /// What happened.
    pub status: HeartbeatStatus,
}

/// Outcome of renewing one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeartbeatStatus {
    /// Renewed for another TTL.
    Renewed,
    /// The lease is stale, foreign or forged: stop and drop the job.
    LeaseLost,
    /// Renewed, but a cancel was requested: stop and acknowledge with fail or release.
    CancelRequested,
}

/// `POST /v1/complete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompleteRequest {
    /// The lease.
    pub lease_token: LeaseToken,
    /// Any JSON value (default null).
    #[serde(default)]
    pub result: Value,
}

/// `POST /v1/fail`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FailRequest {
    /// The lease.
    pub lease_token: LeaseToken,
    /// What went wrong (cut to 16 KiB).
    pub error: String,
    /// Whether another attempt may help (default true).
    #[serde(default = "default_true")]
    pub retryable: bool,
    /// Retry no sooner than this; default: exponential backoff with full jitter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<i64>,
}

/// `POST /v1/release`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The lease.
    pub lease_token: LeaseToken,
    /// A checkpoint the next attempt receives; absent keeps the previous one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// `POST /v1/finish`: many outcomes in one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishRequest {
    /// The outcomes (1 to 1000; none is allowed when `claim` is given),
    /// answered one by one, in order.
    #[serde(default)]
    pub items: Vec<FinishItem>,
    /// A claim made once the items are committed, answered in `leases`: a
    /// worker's loop is then one request per cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimRequest>,
}

/// How a worker ends an attempt: the action of a finish item, of
/// `/v1/complete`, `/v1/fail` and `/v1/release`, the `action` column of the
/// finish statement and the `action` label of metrics, under one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishAction {
    /// As `POST /v1/complete`.
    Complete,
    /// As `POST /v1/fail`.
    Fail,
    /// As `POST /v1/release`.
    Release,
}

impl FinishAction {
    /// Every action.
    pub const ALL: [FinishAction; 3] = [FinishAction::Complete, FinishAction::Fail, FinishAction::Release];

    /// The name on the wire, in SQL and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishAction::Complete => "complete",
            FinishAction::Fail => "fail",
            FinishAction::Release => "release",
        }
    }
}

impl std::fmt::Display for FinishAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FinishAction {
    type Err = UnknownAction;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FinishAction::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAction(s.to_owned()))
    }
}

/// Error for a text that names no finish action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAction(pub String);

impl std::fmt::Display for UnknownAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "unknown finish action {:?}", self.0)
    }
}

impl std::error::Error for UnknownAction {}

/// One outcome of a finish request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishItem {
    /// The lease.
    pub lease_token: LeaseToken,
    /// What to do.
    pub action: FinishAction,
    /// For `complete`: the result (default null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// For `fail`: the error (required there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For `fail`: whether another attempt may help (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    /// For `fail`: retry no sooner than this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<i64>,
    /// For `release`: the checkpoint to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Value>,
}

/// Answer to `POST /v1/finish`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishResponse {
    /// One entry per item, in order.
    pub items: Vec<FinishResult>,
    /// What the request's `claim` handed out (absent without a claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leases: Option<Vec<Lease>>,
}

/// The outcome of one finish item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinishResult {
    /// The job.
    pub job_id: JobId,
    /// The lease.
    pub run_lease: RunLease,
    /// Applied, or refused as stale.
    pub status: FinishStatus,
    /// The job's state after this item (absent for a forged token).
    pub state: Option<JobState>,
}

/// Whether a finish item took effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishStatus {
    /// Applied (or already applied by an earlier call with the same token).
    Ok,
    /// The lease is stale, foreign or forged.
    LeaseLost,
}
