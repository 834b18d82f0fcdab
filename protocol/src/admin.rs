//! Operating a queue: listing its jobs, bulk actions, and its settings
//! (pause, flow-control limits, retention, retry policy, dead-letter queue).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ids::{JobId, QueueName};
use crate::job::{Job, JobState};
use crate::retry::Backoff;

/// Query of `GET /v1/jobs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListJobsQuery {
    /// The queue (required).
    pub queue: Option<String>,
    /// States, comma-separated (default: every state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Page size, 1..=500 (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
}

/// A job as a listing answers it: every field of [`Job`] but `attempts`
/// (read one job for its chronology).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(transparent)]
pub struct ListedJob(pub Job);

impl Serialize for ListedJob {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut value = serde_json::to_value(&self.0).map_err(serde::ser::Error::custom)?;
        if let Some(fields) = value.as_object_mut() {
            fields.remove("attempts");
            fields.remove("earlier_attempts");
        }
        value.serialize(serializer)
    }
}

/// Answer to `GET /v1/jobs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListJobsResponse {
    /// The page, newest first.
    pub jobs: Vec<ListedJob>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    pub next_cursor: Option<String>,
}

/// The action of a bulk request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BulkActionName {
    /// Failed and cancelled jobs back to `queued`.
    Retry,
    /// Claimable jobs cancelled; running jobs asked to stop.
    Cancel,
    /// Terminal jobs deleted, with their chronology.
    Delete,
}

/// `POST /v1/jobs/bulk` (admin).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BulkJobsRequest {
    /// What to do to each matching job.
    pub action: BulkActionName,
    /// The queue (required).
    pub queue: QueueName,
    /// The states to match (at least one).
    pub states: Vec<JobState>,
    /// Only these jobs (at most 10,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ids: Option<Vec<JobId>>,
    /// Only jobs created before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
}

/// Answer to `POST /v1/jobs/bulk`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BulkJobsResponse {
    /// Jobs the filter matched.
    pub matched: u64,
    /// Jobs the action changed; the others its single-job rule refused
    /// (a retry of a `done` job, a delete of a running one).
    pub changed: u64,
}

/// A token-bucket rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    /// Starts per second, on average (> 0).
    pub per_s: f64,
    /// Most starts at once (>= 1).
    pub burst: i32,
}

/// A queue's settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// A paused queue accepts enqueues and hands out no claims.
    pub paused: bool,
    /// Most jobs of the queue running at once (`null`: no limit).
    pub max_running: Option<i32>,
    /// Most running jobs sharing one `concurrency_key` (`null`: no limit).
    pub max_running_per_key: Option<i32>,
    /// Starts per second (`null`: no limit).
    pub rate_limit: Option<RateLimit>,
    /// How long done jobs are kept, ms (`null`: the coordinator's
    /// `RUNLEASE_RETENTION_DONE_MS`; 0: forever).
    pub retention_done_ms: Option<i64>,
    /// How long failed and cancelled jobs are kept, ms (`null`: the
    /// coordinator's `RUNLEASE_RETENTION_FAILED_MS`; 0: forever).
    pub retention_failed_ms: Option<i64>,
    /// Attempt budget of the jobs enqueued without one (`null`: the
    /// coordinator's `RUNLEASE_MAX_ATTEMPTS`).
    #[serde(default)]
    pub max_attempts: Option<i32>,
    /// Backoff of the jobs enqueued without one (`null`: the coordinator's).
    #[serde(default)]
    pub backoff: Option<Backoff>,
    /// Retry window of the jobs enqueued without one, ms (`null`: none).
    #[serde(default)]
    pub retry_window_ms: Option<i64>,
    /// Where a job of the queue that fails for good leaves a follow-up
    /// job (`null`: nowhere).
    #[serde(default)]
    pub dead_letter_queue: Option<QueueName>,
}

/// Reads a field that may be absent (`None`), `null` (`Some(None)`) or a
/// value (`Some(Some(v))`).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// `PATCH /v1/queues/{queue}` (admin): absent fields are unchanged, `null`
/// clears a limit or an override.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateQueueRequest {
    /// Pause (`true`) or resume (`false`); `null` is refused (422).
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub paused: Option<Option<bool>>,
    /// `max_running`, 1..=1,000,000, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_running: Option<Option<i32>>,
    /// `max_running_per_key`, 1..=1,000,000, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_running_per_key: Option<Option<i32>>,
    /// The rate limit, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub rate_limit: Option<Option<RateLimit>>,
    /// Retention of done jobs in ms (0: forever), or `null` for the default.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub retention_done_ms: Option<Option<i64>>,
    /// Retention of failed and cancelled jobs in ms, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub retention_failed_ms: Option<Option<i64>>,
    /// The endpoint that serves the queue, or `null` to remove it.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub endpoint: Option<Option<SetEndpoint>>,
    /// Attempt budget of jobs enqueued later without one, 1..=1000, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub max_attempts: Option<Option<i32>>,
    /// Backoff of jobs enqueued later without one (replaced whole: a field
    /// left out is the coordinator's default), or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub backoff: Option<Option<Backoff>>,
    /// Retry window of jobs enqueued later without one, ms, or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub retry_window_ms: Option<Option<i64>>,
    /// The dead-letter queue (not the queue itself), or `null`.
    #[serde(
        default,
        deserialize_with = "nullable",
        skip_serializing_if = "Option::is_none"
    )]
    pub dead_letter_queue: Option<Option<QueueName>>,
}

/// An endpoint as `PATCH /v1/queues/{queue}` sets it: the coordinators
/// push the queue's jobs to `url` as signed requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetEndpoint {
    /// `https://...` (plain `http` only for a host the coordinator allows).
    pub url: String,
    /// How long a request may stay open, ms: 1,000..=900,000 (default 60,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<i64>,
    /// Most requests open at once across every coordinator: 1..=1,000
    /// (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<i64>,
}

/// A queue's endpoint in its figures: the setting, and what the
/// coordinators saw of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointFigures {
    /// Where the jobs are pushed.
    pub url: String,
    /// How long a request may stay open, ms.
    pub timeout_ms: i64,
    /// Most requests open at once across every coordinator.
    pub concurrency: i64,
    /// False after 5 connection failures in a row, until it answers again.
    pub healthy: bool,
    /// Connection failures in a row (0 after any answer).
    pub consecutive_failures: i64,
    /// Running jobs the endpoint holds (requests open and 202 hand-offs),
    /// across every coordinator.
    pub in_flight: i64,
    /// The last error: a failed connection, or an answer that failed a job.
    pub last_error: Option<String>,
    /// When the last error happened.
    pub last_error_at: Option<DateTime<Utc>>,
}

/// Answer to `GET` and `POST .../rotate` of `/v1/queues/{queue}/endpoint-secret`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointSecretResponse {
    /// Signs every request: `whsec_` + base64 of 32 bytes (Standard Webhooks).
    pub secret: String,
    /// During a rotation, the previous secret, which signs beside it.
    pub previous_secret: Option<String>,
    /// When the previous secret stops signing.
    pub previous_expires_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_update_tells_absent_from_null() {
        let u: UpdateQueueRequest = serde_json::from_str(
            r#"{"paused": true, "max_running": null, "rate_limit": {"per_s": 2.5, "burst": 3}}"#,
        )
        .unwrap();
        assert_eq!(u.paused, Some(Some(true)));
        assert_eq!(u.max_running, Some(None));
        assert_eq!(u.max_running_per_key, None);
        assert_eq!(u.rate_limit, Some(Some(RateLimit { per_s: 2.5, burst: 3 })));
        let back = serde_json::to_value(&u).unwrap();
        assert_eq!(back["max_running"], serde_json::Value::Null);
        assert!(back.get("max_running_per_key").is_none());
        assert!(serde_json::from_str::<UpdateQueueRequest>(r#"{"colour": "red"}"#).is_err());
    }
}
