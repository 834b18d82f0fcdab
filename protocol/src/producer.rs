//! Requests and answers of the producer endpoints.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::admin::QueueSettings;
use crate::ids::QueueName;
use crate::job::Job;

/// `POST /v1/jobs`, and each element of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnqueueJobRequest {
    /// The queue to put the job on.
    pub queue: QueueName,
    /// Any JSON value; handed to the worker as is.
    pub payload: Value,
    /// Smaller runs first (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// Not claimable before this instant. Exclusive with `delay_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<DateTime<Utc>>,
    /// Not claimable before now + this many ms. Exclusive with `run_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<i64>,
    /// Attempt budget (default: the coordinator's `RUNLEASE_MAX_ATTEMPTS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<i32>,
    /// Run-time limit of one attempt (default: `RUNLEASE_DEFAULT_TIMEOUT_MS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    /// A repeat with the same key on the same queue answers the original job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The job's concurrency key (a tenant, a customer): the queue's
    /// `max_running_per_key` limits how many jobs of one key run at once.
    /// 1 to 255 bytes, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency_key: Option<String>,
    /// A name for the job, unique in its batch, that later jobs of the
    /// same batch may name in `depends_on` (1 to 128 bytes).
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub job_ref: Option<String>,
    /// The jobs this one waits for: `ref`s of earlier jobs of the same
    /// batch, or ids of existing jobs (at most 100). While any of them has
    /// not ended the job is `blocked`; when the last one ends `done` it is
    /// queued.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
    /// What a dependency that fails, is cancelled or is deleted does to it
    /// (default `cancel`). Only with `depends_on`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_dependency_failure: Option<crate::job::OnDependencyFailure>,
}

impl EnqueueJobRequest {
    /// A request with every option left to its default.
    pub fn new(queue: QueueName, payload: Value) -> Self {
        Self {
            queue,
            payload,
            priority: None,
            run_at: None,
            delay_ms: None,
            max_attempts: None,
            timeout_ms: None,
            idempotency_key: None,
            concurrency_key: None,
            job_ref: None,
            depends_on: Vec::new(),
            on_dependency_failure: None,
        }
    }
}

/// `POST /v1/jobs/batch`: 1 to 1000 jobs, enqueued in one transaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnqueueBatchRequest {
    /// The jobs, answered in the same order.
    pub jobs: Vec<EnqueueJobRequest>,
}

/// Answer to `POST /v1/jobs/batch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnqueueBatchResponse {
    /// The jobs, in request order.
    pub jobs: Vec<BatchJob>,
}

/// One job of a batch's answer: the job, with the `ref` its request gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchJob {
    /// The request's `ref`, if it gave one.
    #[serde(rename = "ref", default, skip_serializing_if = "Option::is_none")]
    pub job_ref: Option<String>,
    /// The job.
    #[serde(flatten)]
    pub job: Job,
}

/// Query of `GET /v1/jobs/{id}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetJobQuery {
    /// Long-poll until the job is terminal or this many ms pass (0..=60000).
    pub wait_ms: Option<u64>,
}

/// Query of `GET /v1/jobs/{id}/attempts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListAttemptsQuery {
    /// Only attempts of run leases below this one (the first `run_lease`
    /// of the page before); absent: the latest.
    pub before: Option<i64>,
    /// Most attempts on the page (1..=1000, default 100).
    pub limit: Option<u32>,
}

/// Answer to `GET /v1/jobs/{id}/attempts`: ended attempts, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListAttemptsResponse {
    /// The page, oldest first; the job's running attempt is not in it.
    pub attempts: Vec<crate::Attempt>,
    /// Earlier attempts exist: ask again with `before` set to the first
    /// entry's `run_lease`.
    pub earlier: bool,
}

/// Answer to `GET /v1/queues`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListQueuesResponse {
    /// One entry per queue that holds jobs or has settings.
    pub queues: Vec<QueueSummary>,
}

/// The figures of one queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueSummary {
    /// The queue's name.
    pub queue: QueueName,
    /// Jobs per state; every state is present, zero included.
    pub counts: BTreeMap<String, i64>,
    /// Age of the oldest due `queued` or `enqueue_failed` job, if any.
    pub oldest_queued_age_ms: Option<i64>,
    /// Attempts that ended because their lease expired.
    pub lease_expiries: i64,
    /// Attempts that failed and were queued again.
    pub retries: i64,
    /// Due jobs that the queue's pause or limits keep from starting now
    /// (all of them while it is paused, at `max_running` or out of rate
    /// tokens; else those whose key is at `max_running_per_key`).
    #[serde(default)]
    pub held_by_limits: i64,
    /// Its settings (pause, limits, retention overrides).
    #[serde(default)]
    pub settings: QueueSettings,
    /// Jobs that ended in the last [`Throughput::window_ms`].
    #[serde(default)]
    pub throughput: Throughput,
    /// The endpoint that serves the queue, with its health (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<crate::admin::EndpointFigures>,
}

/// How many jobs of a queue reached a terminal state in the last
/// `window_ms` (and are still in it: a retried job leaves `failed`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Throughput {
    /// The window, ms ([`crate::limits::THROUGHPUT_WINDOW_MS`]).
    pub window_ms: i64,
    /// Jobs done in the window.
    pub done: i64,
    /// Jobs failed in the window.
    pub failed: i64,
    /// Jobs cancelled in the window.
    pub cancelled: i64,
}

/// Answer to `GET /v1/whoami`: what the caller's key may do, so a client
/// (the dashboard) can offer only what the coordinator would allow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WhoamiResponse {
    /// `producer`, `worker` or `admin` (`admin` when no keys are
    /// configured); `null` when keys are configured and none was sent.
    pub role: Option<String>,
    /// The queues the key is limited to; `null` for every queue.
    pub queues: Option<Vec<QueueName>>,
    /// Whether the coordinator checks keys at all (`false`: open, loopback only).
    pub keys_configured: bool,
}
