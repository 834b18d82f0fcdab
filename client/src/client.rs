//! `Client`: typed calls for every endpoint of the v1 protocol over one
//! reused connection pool. Calls that are safe to repeat (reads, enqueues with
//! an idempotency key, heartbeats and finishing calls, which are idempotent per
//! lease, and queue settings changes and schedule puts, which set values) are
//! retried on transient failures; the others (cancel, retry, bulk actions,
//! claims, schedule deletes) are not.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use runlease_protocol::producer::{EnqueueBatchRequest, EnqueueBatchResponse, EnqueueJobRequest};
use runlease_protocol::trace::TRACEPARENT;
use runlease_protocol::worker::{
    ClaimRequest, ClaimResponse, CompleteRequest, FailRequest, FinishRequest, FinishResponse,
    HeartbeatRequest, HeartbeatResponse, ReleaseRequest,
};
use runlease_protocol::{ErrorBody, ErrorCode, Job, JobId, QueueName, TraceParent, routes};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::retry::RetryPolicy;

mod admin;
mod builder;

pub use builder::ClientBuilder;

/// Default request timeout, on top of any long-poll the request asks for.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default connect timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest single long-poll `wait` asks for; longer waits re-issue the read.
const MAX_WAIT_PER_REQUEST: Duration = Duration::from_secs(30);

/// A runlease coordinator, seen from a producer or a worker. Cheap to clone:
/// clones share one connection pool.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    key: Option<String>,
    timeout: Duration,
    retry: RetryPolicy,
    traceparent: Option<TraceParent>,
}

/// Whether a call may be repeated after a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repeat {
    Safe,
    Once,
}

fn decode_error(status: StatusCode, retry_after: Option<Duration>, bytes: &[u8]) -> Error {
    let (code, message) = match serde_json::from_slice::<ErrorBody>(bytes) {
        Ok(body) => (Some(body.error.code), body.error.message),
        Err(_) => (None, String::from_utf8_lossy(bytes).trim().to_owned()),
    };
    match (code, status.as_u16()) {
        (Some(ErrorCode::LeaseLost), _) => Error::LeaseLost(message),
        (Some(ErrorCode::Conflict), _) => Error::Conflict(message),
        (Some(ErrorCode::NotFound), _) | (None, 404) => Error::NotFound(message),
        (Some(ErrorCode::Unauthorized), _) | (None, 401) => Error::Unauthorized(message),
        (Some(ErrorCode::Forbidden), _) | (None, 403) => Error::Forbidden(message),
        (Some(ErrorCode::Overloaded), _) | (None, 429 | 503) => Error::Overloaded { retry_after, message },
        (
            Some(
                code @ (ErrorCode::BadRequest
                | ErrorCode::Invalid
                | ErrorCode::TooLarge
                | ErrorCode::MethodNotAllowed),
            ),
            _,
        ) => Error::Invalid { code, message },
        (None, 400..=499) => Error::Invalid {
            code: ErrorCode::BadRequest,
            message,
        },
        (_, status) => Error::Server { status, message },
    }
}

impl Client {
    /// A client for the coordinator at `base_url` with default settings.
    pub fn new(base_url: impl Into<String>) -> Result<Self> {
        Self::builder(base_url).build()
    }

    /// Settings for a client of the coordinator at `base_url`.
    pub fn builder(base_url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            base_url: base_url.into(),
            key: None,
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            retry: RetryPolicy::default(),
        }
    }

    /// The coordinator's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn send_once<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &Method,
        path: &str,
        body: Option<&B>,
        long_poll: Duration,
    ) -> Result<T> {
        let mut rb = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .timeout(self.timeout + long_poll);
        if let Some(key) = &self.key {
            rb = rb.bearer_auth(key);
        }
        if let Some(traceparent) = &self.traceparent {
            rb = rb.header(TRACEPARENT, traceparent.as_str());
        }
        if let Some(body) = body {
            rb = rb.json(body);
        }
        let response = rb.send().await.map_err(|e| Error::Transport(e.to_string()))?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Error::Transport(e.to_string()))?;
        if !status.is_success() {
            return Err(decode_error(status, retry_after, &bytes));
        }
        serde_json::from_slice(&bytes).map_err(|e| Error::Decode(format!("{method} {path}: {e}")))
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        repeat: Repeat,
        long_poll: Duration,
    ) -> Result<T> {
        let tries = if repeat == Repeat::Safe {
            self.retry.max_attempts.max(1)
        } else {
            1
        };
        let mut attempt = 1;
        loop {
            match self.send_once(&method, path, body, long_poll).await {
                Err(e) if e.is_transient() && attempt < tries => {
                    let delay = self.retry.delay(attempt, e.retry_after());
                    tracing::debug!(error = %e, ?delay, attempt, "{method} {path} failed; retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    /// The same client sending `traceparent` (W3C Trace Context) with every
    /// request: jobs it enqueues carry the producer's trace to their
    /// workers, and the coordinator's spans join it. Clones share the
    /// connection pool, so a clone per traced operation is cheap.
    pub fn with_traceparent(&self, traceparent: TraceParent) -> Self {
        Self {
            traceparent: Some(traceparent),
            ..self.clone()
        }
    }

    /// Enqueues `payload` on `queue`.
    pub async fn enqueue<P: Serialize>(&self, queue: &str, payload: &P) -> Result<Job> {
        let queue = QueueName::new(queue).map_err(|e| Error::Config(e.to_string()))?;
        let payload = serde_json::to_value(payload).map_err(|e| Error::Config(format!("payload: {e}")))?;
        self.enqueue_with(EnqueueJobRequest::new(queue, payload)).await
    }

    /// Enqueues one job with every option. Without an idempotency key the
    /// client makes one, so a retry after a lost answer cannot enqueue twice.
    pub async fn enqueue_with(&self, mut req: EnqueueJobRequest) -> Result<Job> {
        req.idempotency_key.get_or_insert_with(new_idempotency_key);
        self.call(
            Method::POST,
            routes::JOBS,
            Some(&req),
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Enqueues up to 1000 jobs in one transaction, answered in order (a
    /// job's `ref`, if it gave one, is its place in the list). Jobs may
    /// depend on earlier ones by `ref` (`depends_on`).
    pub async fn enqueue_batch(&self, mut jobs: Vec<EnqueueJobRequest>) -> Result<Vec<Job>> {
        for job in &mut jobs {
            job.idempotency_key.get_or_insert_with(new_idempotency_key);
        }
        let req = EnqueueBatchRequest { jobs };
        let answer: EnqueueBatchResponse = self
            .call(
                Method::POST,
                routes::JOBS_BATCH,
                Some(&req),
                Repeat::Safe,
                Duration::ZERO,
            )
            .await?;
        Ok(answer.jobs.into_iter().map(|b| b.job).collect())
    }

    /// Reads a job.
    pub async fn get(&self, id: JobId) -> Result<Job> {
        self.call::<(), _>(
            Method::GET,
            &routes::job_path(routes::JOB, id),
            None,
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Waits until the job is terminal, long-polling; `Err(WaitTimedOut)`
    /// with the job as last seen when `timeout` passes first.
    pub async fn wait(&self, id: JobId, timeout: Duration) -> Result<Job> {
        self.wait_with(id, timeout, |_| {}).await
    }

    /// As [`Client::wait`], calling `seen` with each answer (to show progress).
    pub async fn wait_with(&self, id: JobId, timeout: Duration, mut seen: impl FnMut(&Job)) -> Result<Job> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let wait = left.min(MAX_WAIT_PER_REQUEST);
            let path = format!(
                "{}?wait_ms={}",
                routes::job_path(routes::JOB, id),
                wait.as_millis()
            );
            let job: Job = self
                .call::<(), _>(Method::GET, &path, None, Repeat::Safe, wait)
                .await?;
            seen(&job);
            if job.state.is_terminal() {
                return Ok(job);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::WaitTimedOut(Box::new(job)));
            }
        }
    }

    /// Cancels a job (a running one stops at its worker's next heartbeat).
    pub async fn cancel(&self, id: JobId) -> Result<Job> {
        let path = routes::job_path(routes::JOB_CANCEL, id);
        self.call(
            Method::POST,
            &path,
            Some(&serde_json::json!({})),
            Repeat::Once,
            Duration::ZERO,
        )
        .await
    }

    /// Puts a failed or cancelled job back on its queue (admin key).
    pub async fn retry(&self, id: JobId) -> Result<Job> {
        let path = routes::job_path(routes::JOB_RETRY, id);
        self.call(
            Method::POST,
            &path,
            Some(&serde_json::json!({})),
            Repeat::Once,
            Duration::ZERO,
        )
        .await
    }

    /// Claims leases. Not retried: a claim whose answer was lost leaves leases
    /// that only expire; the caller decides when to claim again.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<ClaimResponse> {
        let wait = Duration::from_millis(req.wait_ms);
        self.call(Method::POST, routes::CLAIM, Some(req), Repeat::Once, wait)
            .await
    }

    /// Renews leases. `retry` false sends it once (the worker runtime's
    /// heartbeat loop retries on its own schedule).
    pub async fn heartbeat(&self, req: &HeartbeatRequest, retry: bool) -> Result<HeartbeatResponse> {
        let repeat = if retry { Repeat::Safe } else { Repeat::Once };
        self.call(Method::POST, routes::HEARTBEAT, Some(req), repeat, Duration::ZERO)
            .await
    }

    /// Completes a lease (idempotent per lease, so retried).
    pub async fn complete(&self, req: &CompleteRequest) -> Result<Job> {
        self.call(
            Method::POST,
            routes::COMPLETE,
            Some(req),
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Fails a lease (idempotent per lease, so retried).
    pub async fn fail(&self, req: &FailRequest) -> Result<Job> {
        self.call(
            Method::POST,
            routes::FAIL,
            Some(req),
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Releases a lease (idempotent per lease, so retried).
    pub async fn release(&self, req: &ReleaseRequest) -> Result<Job> {
        self.call(
            Method::POST,
            routes::RELEASE,
            Some(req),
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }

    /// Finishes many leases in one request (idempotent per lease, so retried).
    pub async fn finish(&self, req: &FinishRequest) -> Result<FinishResponse> {
        self.call(
            Method::POST,
            routes::FINISH,
            Some(req),
            Repeat::Safe,
            Duration::ZERO,
        )
        .await
    }
}

/// `value` percent-encoded for a query string (all but RFC 3986's unreserved bytes).
fn encode_query_value(value: &str) -> String {
    let mut encoded = String::with_capacity(value.len());
    for b in value.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    encoded
}

/// A fresh idempotency key for a job the caller gave none.
fn new_idempotency_key() -> String {
    format!("rl-client-{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use runlease_protocol::limits::MAX_SCHEDULE_NAME_LEN;

    use super::admin::checked_schedule_path;
    use super::*;

    #[test]
    fn error_bodies_map_to_variants() {
        let body = |code: &str| format!("{{\"error\":{{\"code\":\"{code}\",\"message\":\"m\"}}}}");
        assert!(matches!(
            decode_error(StatusCode::CONFLICT, None, body("lease_lost").as_bytes()),
            Error::LeaseLost(_)
        ));
        assert!(matches!(
            decode_error(StatusCode::CONFLICT, None, body("conflict").as_bytes()),
            Error::Conflict(_)
        ));
        assert!(matches!(
            decode_error(StatusCode::NOT_FOUND, None, body("not_found").as_bytes()),
            Error::NotFound(_)
        ));
        assert!(matches!(
            decode_error(StatusCode::UNPROCESSABLE_ENTITY, None, body("invalid").as_bytes()),
            Error::Invalid {
                code: ErrorCode::Invalid,
                ..
            }
        ));
        let e = decode_error(
            StatusCode::SERVICE_UNAVAILABLE,
            Some(Duration::from_secs(2)),
            body("overloaded").as_bytes(),
        );
        assert!(e.is_transient());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert!(matches!(
            decode_error(StatusCode::BAD_GATEWAY, None, b"<html>"),
            Error::Server { status: 502, .. }
        ));
        assert!(Client::new("ftp://x").is_err());
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode_query_value("mail/eu@x:1"), "mail%2Feu%40x%3A1");
        assert_eq!(encode_query_value("failed,done"), "failed%2Cdone");
        assert_eq!(encode_query_value("AZaz09-_.~"), "AZaz09-_.~");
    }

    #[test]
    fn schedule_names_are_checked_and_encoded() {
        assert_eq!(checked_schedule_path("nightly").unwrap(), "/v1/schedules/nightly");
        assert_eq!(
            checked_schedule_path("eu/nightly report").unwrap(),
            "/v1/schedules/eu%2Fnightly%20report"
        );
        assert!(matches!(checked_schedule_path(""), Err(Error::Config(_))));
        assert!(matches!(checked_schedule_path("a\nb"), Err(Error::Config(_))));
        assert!(matches!(
            checked_schedule_path(&"x".repeat(MAX_SCHEDULE_NAME_LEN + 1)),
            Err(Error::Config(_))
        ));
        assert!(checked_schedule_path(&"x".repeat(MAX_SCHEDULE_NAME_LEN)).is_ok());
    }
}
