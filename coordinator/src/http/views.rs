//! The store's rows as the protocol answers them: the one place a job row
//! becomes a wire `Job`.

use axum::http::header;
use axum::response::{IntoResponse, Response};
use runlease_protocol::{Attempt, Job, JobLink, LeaseDependency};

use crate::http::error::ApiError;

use crate::store::dependencies::{DependencyRow, Link};
use crate::store::rows::{AttemptRow, JobRow};

/// A job row (with its chronology attached) as the protocol's job.
pub fn job(row: JobRow) -> Job {
    Job {
        id: row.id,
        queue: row.queue,
        state: row.state,
        payload: row.payload,
        priority: row.priority,
        attempt: row.attempt,
        max_attempts: row.max_attempts,
        backoff: (!row.backoff.is_empty()).then_some(row.backoff),
        retry_window_ms: row.retry_window_ms,
        run_lease: row.run_lease,
        run_at: row.run_at,
        created_at: row.created_at,
        updated_at: row.updated_at,
        finished_at: row.finished_at,
        timeout_ms: row.timeout_ms,
        idempotency_key: row.idempotency_key,
        concurrency_key: row.concurrency_key,
        progress: row.progress,
        result: row.result,
        error: row.error,
        cancel_requested: row.cancel_requested_at.is_some(),
        traceparent: row.traceparent,
        attempts: row.attempts.into_iter().map(attempt).collect(),
        earlier_attempts: row.earlier_attempts,
        on_dependency_failure: row.on_dependency_failure,
        dependencies: row.dependencies.into_iter().map(link).collect(),
        dependents: row.dependents.into_iter().map(link).collect(),
    }
}

/// A dependency link as the protocol's.
pub fn link(l: Link) -> JobLink {
    JobLink {
        id: l.id,
        state: l.state,
    }
}

/// A leased job's dependency as its lease carries it.
pub fn lease_dependency(d: DependencyRow) -> LeaseDependency {
    LeaseDependency {
        id: d.id,
        state: d.state,
        result: d.result,
    }
}

/// An attempt row as the protocol's attempt.
pub fn attempt(a: AttemptRow) -> Attempt {
    Attempt {
        run_lease: a.run_lease,
        worker_id: a.worker_id,
        claimed_at: a.claimed_at,
        finished_at: a.finished_at,
        outcome: a.outcome,
        error: a.error,
        retry_at: a.retry_at,
        retry_reason: a.retry_reason,
    }
}

/// Room per job in an answer holding many (a job with a small payload
/// takes about 460 bytes): the buffer is sized once instead of doubling
/// from axum's 128 bytes a dozen times, each a copy of what was written.
const ANSWER_BYTES_PER_JOB: usize = 512;

/// `value` as JSON, written into a buffer sized for `jobs` jobs.
pub fn to_json<T: serde::Serialize>(value: &T, jobs: usize) -> Result<Vec<u8>, ApiError> {
    let mut buf = Vec::with_capacity(64 + jobs * ANSWER_BYTES_PER_JOB);
    serde_json::to_writer(&mut buf, value).map_err(|e| {
        ApiError::new(
            runlease_protocol::ErrorCode::Internal,
            format!("cannot write the answer: {e}"),
        )
    })?;
    Ok(buf)
}

/// A JSON answer written already.
pub struct JsonBytes(pub Vec<u8>);

impl IntoResponse for JsonBytes {
    fn into_response(self) -> Response {
        ([(header::CONTENT_TYPE, "application/json")], self.0).into_response()
    }
}

/// A JSON answer of `jobs` jobs, written into a buffer sized for them.
pub struct JobsJson<T> {
    /// The answer.
    pub value: T,
    /// How many jobs it holds.
    pub jobs: usize,
}

impl<T: serde::Serialize> IntoResponse for JobsJson<T> {
    fn into_response(self) -> Response {
        match to_json(&self.value, self.jobs) {
            Ok(body) => JsonBytes(body).into_response(),
            Err(e) => e.into_response(),
        }
    }
}
