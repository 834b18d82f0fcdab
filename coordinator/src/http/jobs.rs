//! Producer endpoints: enqueue (one, batch), get (long-poll), cancel, retry.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use runlease_protocol::limits::{
    MAX_ATTEMPTS_PAGE, MAX_ATTEMPTS_PER_JOB_ANSWER, MAX_BATCH_JOBS, MAX_CONCURRENCY_KEY_LEN, MAX_DELAY_MS,
    MAX_IDEMPOTENCY_KEY_LEN, MAX_TIMEOUT_MS, MAX_WAIT_MS,
};
use runlease_protocol::producer::{
    BatchJob, EnqueueBatchRequest, EnqueueBatchResponse, EnqueueJobRequest, GetJobQuery, ListAttemptsQuery,
    ListAttemptsResponse,
};
use runlease_protocol::{Job, JobId, JobState, RunLease, TraceParent, retry};
use tokio::time::Instant;

use crate::auth::{Action, Caller};
use crate::batch::enqueue::NewJobs;
use crate::http::AppState;
use crate::http::dependencies;
use crate::http::error::ApiError;
use crate::http::extract::{JobIdPath, JsonBody, QueryParams, TraceContext, require};
use crate::http::views;
use crate::metrics::{QueueLabels, Via, WaiterGauge};
use crate::store::jobs::{CancelOutcome, NewJob, RetryOutcome};
use crate::store::rows::JobRow;
use crate::wake::{jittered, next_job_wake};

fn record_job(job: &JobRow) {
    let span = tracing::Span::current();
    span.record("job_id", tracing::field::display(job.id));
    span.record("run_lease", job.run_lease.0);
    // The job's trace context, also where the request carried none (a
    // cancel or a read by another service).
    if let Some(t) = &job.traceparent {
        span.record("trace_id", t.trace_id());
        span.record("traceparent", t.as_str());
    }
}

/// Validates and permission-checks one enqueue request.
/// `traceparent` is the request's trace context, stored with the job.
fn new_job(
    caller: &Caller,
    req: EnqueueJobRequest,
    traceparent: Option<&TraceParent>,
) -> Result<NewJob, ApiError> {
    if !caller.may_use_queue(&req.queue) {
        return Err(ApiError::forbidden_queue(req.queue.as_str()));
    }
    let mut job = validate_enqueue(req).map_err(ApiError::invalid)?;
    job.traceparent = traceparent.cloned();
    Ok(job)
}

/// An enqueue request checked against the protocol's bounds, with the
/// coordinator's defaults applied; the error says which field is wrong and why.
fn validate_enqueue(req: EnqueueJobRequest) -> Result<NewJob, String> {
    if req.run_at.is_some() && req.delay_ms.is_some() {
        return Err("give run_at or delay_ms, not both".into());
    }
    if !runlease_protocol::limits::storable_json(&req.payload) {
        return Err("payload must not contain a NUL character (\\u0000)".into());
    }
    if let Some(delay) = req.delay_ms
        && !(0..=MAX_DELAY_MS).contains(&delay)
    {
        return Err(format!("delay_ms must be between 0 and {MAX_DELAY_MS}"));
    }
    if let Some(n) = req.max_attempts {
        retry::check_max_attempts(n)?;
    }
    let backoff = req.backoff.unwrap_or_default();
    backoff.check()?;
    if let Some(window) = req.retry_window_ms {
        retry::check_retry_window(window)?;
    }
    if let Some(timeout) = req.timeout_ms
        && !(1..=MAX_TIMEOUT_MS).contains(&timeout)
    {
        return Err(format!("timeout_ms must be between 1 and {MAX_TIMEOUT_MS}"));
    }
    if let Some(key) = &req.idempotency_key
        && (key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN)
    {
        return Err(format!(
            "idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} bytes long"
        ));
    }
    if let Some(key) = &req.concurrency_key
        && (key.is_empty() || key.len() > MAX_CONCURRENCY_KEY_LEN || key.contains('\0'))
    {
        return Err(format!(
            "concurrency_key must be 1 to {MAX_CONCURRENCY_KEY_LEN} bytes long, without NUL"
        ));
    }
    Ok(NewJob {
        id: JobId::new(),
        queue: req.queue,
        payload: req.payload,
        priority: req.priority.unwrap_or(0),
        run_at: req.run_at,
        delay_ms: req.delay_ms,
        max_attempts: req.max_attempts,
        backoff,
        retry_window_ms: req.retry_window_ms,
        timeout_ms: req.timeout_ms,
        idempotency_key: req.idempotency_key,
        concurrency_key: req.concurrency_key,
        traceparent: None,
        dependencies: None,
    })
}

/// Counts and logs a job an enqueue created.
fn count_new(state: &AppState, job: &Job) {
    state
        .metrics
        .enqueued
        .get_or_create(&QueueLabels {
            queue: job.queue.to_string(),
        })
        .inc();
    job_event!(
        job.traceparent.is_some(),
        job_id = %job.id,
        queue = %job.queue,
        trace_id = job.traceparent.as_ref().map(TraceParent::trace_id),
        "job enqueued"
    );
    if job.state == JobState::Cancelled {
        // A dependency had already failed: cancelled as it was enqueued,
        // counted as the end of a dependency would count it.
        state.metrics.transition_of(
            job.queue.as_str(),
            JobState::Cancelled,
            job.created_at,
            job.finished_at,
            Via::Dependency,
        );
    }
}

/// `POST /v1/jobs`: 201 with the new job; 200 with the original for a repeated idempotency key.
pub async fn enqueue(
    State(state): State<AppState>,
    caller: Caller,
    TraceContext(traceparent): TraceContext,
    JsonBody(req): JsonBody<EnqueueJobRequest>,
) -> Result<(StatusCode, Json<Job>), ApiError> {
    require(&caller, Action::Enqueue)?;
    let deps = dependencies::resolve(std::slice::from_ref(&req))
        .map_err(|e| ApiError::invalid(e.trim_start_matches("jobs[0]: ")))?;
    let mut job = new_job(&caller, req, traceparent.as_ref())?;
    job.dependencies = deps.into_iter().next().flatten();
    let enqueued = state.enqueuer.submit(job).await??;
    record_job(&enqueued.job);
    let job = views::job(enqueued.job);
    // The enqueuer announced the job with the rest of its batch (and marked
    // it `enqueue_failed` when the wake-up did not go out).
    if enqueued.created {
        count_new(&state, &job);
    }
    let status = if enqueued.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(job)))
}

/// `POST /v1/jobs/batch`: 1 to 1000 jobs in one transaction; 201 in request order.
pub async fn enqueue_batch(
    State(state): State<AppState>,
    caller: Caller,
    TraceContext(traceparent): TraceContext,
    JsonBody(req): JsonBody<EnqueueBatchRequest>,
) -> Result<(StatusCode, views::JsonBytes), ApiError> {
    require(&caller, Action::Enqueue)?;
    if req.jobs.is_empty() || req.jobs.len() > MAX_BATCH_JOBS {
        return Err(ApiError::invalid(format!(
            "jobs must hold 1 to {MAX_BATCH_JOBS} jobs"
        )));
    }
    let deps = dependencies::resolve(&req.jobs).map_err(ApiError::invalid)?;
    let refs: Vec<Option<String>> = req.jobs.iter().map(|r| r.job_ref.clone()).collect();
    // Sized at once: collecting through `Result` would grow it by doubling,
    // moving every job written so far each time.
    let mut jobs = Vec::with_capacity(req.jobs.len());
    for (i, (r, deps)) in req.jobs.into_iter().zip(deps).enumerate() {
        let mut job = new_job(&caller, r, traceparent.as_ref()).map_err(|e| ApiError {
            message: format!("jobs[{i}]: {}", e.message),
            ..e
        })?;
        job.dependencies = deps;
        jobs.push(job);
    }
    // The answer is made while the COMMIT travels: ready once the jobs are
    // written.
    let (mut answer, created, body) = state
        .store
        .enqueue_then(&jobs, |enqueued| {
            let created: Vec<bool> = enqueued.iter().map(|e| e.created).collect();
            let answer = EnqueueBatchResponse {
                jobs: enqueued
                    .into_iter()
                    .zip(refs.iter().cloned())
                    .map(|(e, job_ref)| BatchJob {
                        job_ref,
                        job: views::job(e.job),
                    })
                    .collect(),
            };
            let body = views::to_json(&answer, answer.jobs.len());
            (answer, created, body)
        })
        .await?;
    let mut new = NewJobs::default();
    for (b, _) in answer.jobs.iter().zip(created).filter(|(_, created)| *created) {
        count_new(&state, &b.job);
        new.add(b.job.id, &b.job.queue, b.job.state, b.job.priority, b.job.run_at);
    }
    // Jobs marked `enqueue_failed` (their wake-up did not go out) are
    // answered as marked.
    let marked = new.announce(&state.wake, &state.store, &state.metrics).await;
    let body = if marked.is_empty() {
        body?
    } else {
        for b in &mut answer.jobs {
            if marked.contains(&b.job.id) {
                b.job.state = JobState::EnqueueFailed;
            }
        }
        views::to_json(&answer, answer.jobs.len())?
    };
    Ok((StatusCode::CREATED, views::JsonBytes(body)))
}

/// Reads a job the caller may see; 404 otherwise.
async fn visible_job(state: &AppState, caller: &Caller, id: JobId) -> Result<JobRow, ApiError> {
    match state.store.get_job(id).await? {
        Some(job) if caller.may_use_queue(&job.queue) => Ok(job),
        _ => Err(ApiError::job_not_found()),
    }
}

/// `GET /v1/jobs/{id}/attempts?before=&limit=`: a page of the job's ended
/// attempts, oldest first, walking back from the latest.
pub async fn list_attempts(
    State(state): State<AppState>,
    caller: Caller,
    JobIdPath(id): JobIdPath,
    QueryParams(query): QueryParams<ListAttemptsQuery>,
) -> Result<Json<ListAttemptsResponse>, ApiError> {
    require(&caller, Action::Read)?;
    let limit = query.limit.unwrap_or(MAX_ATTEMPTS_PER_JOB_ANSWER);
    if !(1..=MAX_ATTEMPTS_PAGE).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_ATTEMPTS_PAGE}"
        )));
    }
    let before = RunLease(query.before.unwrap_or(i64::MAX));
    // The job must exist and be visible to the caller's key.
    let job = visible_job(&state, &caller, id).await?;
    record_job(&job);
    let (attempts, earlier) = state.store.attempt_page(id, before, limit).await?;
    Ok(Json(ListAttemptsResponse {
        attempts: attempts.into_iter().map(views::attempt).collect(),
        earlier,
    }))
}

/// Parked job reads that re-check PostgreSQL per `RUNLEASE_CLAIM_RECHECK_MS`
/// at most (more parked reads each re-check less often).
const READS_RECHECKED_PER_INTERVAL: usize = 500;

/// `GET /v1/jobs/{id}?wait_ms=N`: the job; with `wait_ms`, once it is terminal
/// or N ms have passed, whichever is first.
pub async fn get_job(
    State(state): State<AppState>,
    caller: Caller,
    JobIdPath(id): JobIdPath,
    QueryParams(query): QueryParams<GetJobQuery>,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Read)?;
    let wait_ms = query.wait_ms.unwrap_or(0);
    if wait_ms > MAX_WAIT_MS {
        return Err(ApiError::invalid(format!(
            "wait_ms must be between 0 and {MAX_WAIT_MS}"
        )));
    }
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    // Subscribed before the first read: a completion in between still wakes us.
    let mut wakes = state.wake.subscribe_jobs();
    // Counted from the first look that found the job unfinished: a parked
    // read is one a wake-up (or the timer) must answer.
    let mut waiting = None;
    let mut parking = None;
    loop {
        let job = visible_job(&state, &caller, id).await?;
        record_job(&job);
        let now = Instant::now();
        if job.state.is_terminal() || now >= deadline || state.shutdown.is_cancelled() {
            return Ok(Json(views::job(job)));
        }
        if parking.is_none() {
            parking = Some(state.park_read(&caller)?);
        }
        waiting.get_or_insert_with(|| WaiterGauge::new(&state.metrics.job_waiters));
        // Wake-ups answer a parked read; the timer is the fallback. Many
        // parked reads look less often each, so together they make at most
        // about READS_RECHECKED_PER_INTERVAL reads per interval.
        let spread = (state.parked_reads.parked() / READS_RECHECKED_PER_INTERVAL).max(1) as u32;
        let nap = jittered(state.recheck * spread).min(deadline - now);
        tokio::select! {
            () = next_job_wake(&mut wakes, id) => {}
            () = tokio::time::sleep(nap) => {}
            () = state.shutdown.cancelled() => {}
        }
    }
}

/// `POST /v1/jobs/{id}/cancel`: a claimable job is cancelled at once; a running
/// one gets `cancel_requested` and stops at its worker's next heartbeat.
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    JobIdPath(id): JobIdPath,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Cancel)?;
    if caller.queues.is_some() {
        visible_job(&state, &caller, id).await?;
    }
    match state.store.cancel(id).await? {
        CancelOutcome::Done(job) => {
            record_job(&job);
            if job.state.is_terminal() {
                state.metrics.transition(&job, Via::Cancel);
                state.wake.terminal(job.id);
                tracing::info!("job cancelled");
            } else {
                tracing::info!("cancel requested of a running job");
            }
            Ok(Json(views::job(*job)))
        }
        CancelOutcome::NotFound => Err(ApiError::job_not_found()),
        CancelOutcome::Terminal(s) => Err(ApiError::conflict(format!(
            "the job is already {s}; only queued or running jobs can be cancelled"
        ))),
    }
}

/// `POST /v1/jobs/{id}/retry`: a failed or cancelled job back to `queued`
/// with a fresh attempt budget (admin only).
pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    JobIdPath(id): JobIdPath,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Retry)?;
    if caller.queues.is_some() {
        visible_job(&state, &caller, id).await?;
    }
    match state.store.retry(id).await? {
        RetryOutcome::Done(job) => {
            record_job(&job);
            tracing::info!("job retried by an admin");
            state.wake.ready(&job.queue);
            Ok(Json(views::job(*job)))
        }
        RetryOutcome::NotFound => Err(ApiError::job_not_found()),
        RetryOutcome::NotRetryable(s) => Err(ApiError::conflict(format!(
            "the job is {s}; only failed or cancelled jobs can be retried"
        ))),
    }
}
