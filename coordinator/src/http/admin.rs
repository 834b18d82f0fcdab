//! Operating endpoints: listing a queue's jobs, bulk actions, and one
//! queue's figures and settings. Store types become protocol types here.

use axum::Json;
use axum::extract::State;
use runlease_protocol::admin::{
    BulkActionName, BulkJobsRequest, BulkJobsResponse, EndpointFigures, EndpointSecretResponse,
    ListJobsQuery, ListJobsResponse, ListedJob, QueueSettings as WireSettings, RateLimit as WireRateLimit,
    SetEndpoint, UpdateQueueRequest,
};
use runlease_protocol::limits::{
    DEFAULT_LIST_LIMIT, MAX_BULK_IDS, MAX_LIST_LIMIT, MAX_RATE, MAX_RETENTION_MS, MAX_RUNNING_LIMIT,
    MIN_RATE_PER_S, THROUGHPUT_WINDOW_MS,
};
use runlease_protocol::producer::{QueueSummary, Throughput};
use runlease_protocol::{ErrorCode, JobState, QueueName, retry};

use crate::auth::{Action, Caller};
use crate::endpoint::{
    DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_MS, MAX_CONCURRENCY, MAX_TIMEOUT_MS, MIN_TIMEOUT_MS, UNHEALTHY_AFTER,
};
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, QueryParams, QueuePath, require, require_for_queue};
use crate::http::{AppState, views};
use crate::metrics::{ActionLabels, QueueLabels, Via};
use crate::store::listing::{BulkAction, JobChange, JobFilter};
use crate::store::queues::{
    EndpointKeys, EndpointSetting, QueueFigures, QueueSettings, RateLimit, SettingsChange,
};

/// A queue's figures as the protocol answers them.
pub fn queue_summary(figures: QueueFigures) -> QueueSummary {
    let ended = |s: JobState| figures.ended_recently.get(&s).copied().unwrap_or(0);
    QueueSummary {
        queue: figures.queue,
        counts: figures
            .counts
            .into_iter()
            .map(|(state, n)| (state.as_str().to_owned(), n))
            .collect(),
        oldest_queued_age_ms: figures.oldest_queued_age_ms,
        lease_expiries: figures.lease_expiries,
        retries: figures.retries,
        held_by_limits: figures.held_by_limits,
        throughput: Throughput {
            window_ms: THROUGHPUT_WINDOW_MS,
            done: ended(JobState::Done),
            failed: ended(JobState::Failed),
            cancelled: ended(JobState::Cancelled),
        },
        settings: wire_settings(&figures.settings),
        endpoint: figures.settings.endpoint.as_ref().map(|e| EndpointFigures {
            url: e.url.clone(),
            timeout_ms: i64::from(e.timeout_ms),
            concurrency: i64::from(e.concurrency),
            healthy: figures.endpoint_health.failures < UNHEALTHY_AFTER as i32,
            consecutive_failures: i64::from(figures.endpoint_health.failures),
            in_flight: figures.endpoint_in_flight,
            last_error: figures.endpoint_health.last_error.clone(),
            last_error_at: figures.endpoint_health.last_error_at,
        }),
    }
}

fn wire_settings(s: &QueueSettings) -> WireSettings {
    WireSettings {
        paused: s.paused,
        max_running: s.max_running,
        max_running_per_key: s.max_running_per_key,
        rate_limit: s.rate_limit.map(|r| WireRateLimit {
            per_s: r.per_s,
            burst: r.burst,
        }),
        retention_done_ms: s.retention_done_ms,
        retention_failed_ms: s.retention_failed_ms,
        max_attempts: s.retry.max_attempts,
        backoff: (!s.retry.backoff.is_empty()).then_some(s.retry.backoff),
        retry_window_ms: s.retry.retry_window_ms,
        dead_letter_queue: s.dead_letter_queue.clone(),
    }
}

fn queue_param(raw: String) -> Result<QueueName, ApiError> {
    QueueName::new(raw).map_err(|e| ApiError::invalid(format!("queue: {e}")))
}

/// `state=S[,S2]`: every state when absent; each named once, in lifecycle order.
fn parse_states(raw: Option<&str>) -> Result<Vec<JobState>, ApiError> {
    let Some(raw) = raw else {
        return Ok(JobState::ALL.to_vec());
    };
    let mut states = Vec::new();
    for name in raw.split(',').map(str::trim) {
        let state: JobState = name.parse().map_err(|_| {
            ApiError::invalid(format!(
                "state {name:?} is not a job state; use blocked, queued, enqueue_failed, running, done, failed or cancelled (comma-separated)"
            ))
        })?;
        if !states.contains(&state) {
            states.push(state);
        }
    }
    states.sort_unstable_by_key(|s| JobState::ALL.iter().position(|a| a == s));
    Ok(states)
}

/// What a cursor is signed with: the listing it belongs to.
fn cursor_scope(filter: &JobFilter) -> String {
    let states: Vec<&str> = filter.states.iter().map(|s| s.as_str()).collect();
    format!("{}\0{}", filter.queue.as_str(), states.join(","))
}

/// `GET /v1/jobs?queue=Q&state=S[,S2]&limit=N&cursor=C`: a queue's jobs,
/// newest first, a page at a time (admin or producer).
pub async fn list_jobs(
    State(state): State<AppState>,
    caller: Caller,
    QueryParams(query): QueryParams<ListJobsQuery>,
) -> Result<views::JobsJson<ListJobsResponse>, ApiError> {
    require(&caller, Action::List)?;
    let queue = query
        .queue
        .ok_or_else(|| ApiError::invalid("queue is required: GET /v1/jobs?queue=NAME"))?;
    let queue = queue_param(queue)?;
    if !caller.may_use_queue(&queue) {
        return Err(ApiError::forbidden_queue(queue.as_str()));
    }
    let limit = query.limit.unwrap_or(DEFAULT_LIST_LIMIT);
    if !(1..=MAX_LIST_LIMIT).contains(&limit) {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {MAX_LIST_LIMIT}"
        )));
    }
    let filter = JobFilter {
        queue,
        states: parse_states(query.state.as_deref())?,
        created_before: None,
    };
    let scope = cursor_scope(&filter);
    let cursor = query
        .cursor
        .map(|c| state.tokens.verify_cursor(&c, &scope))
        .transpose()
        .map_err(|_| {
            ApiError::invalid(
                "cursor was not issued for this listing: pass a next_cursor unchanged, with the same queue and state",
            )
        })?;
    let page = state
        .store
        .list_jobs(&filter, cursor, i64::from(limit), state.max_answer_bytes)
        .await?;
    let answer = ListJobsResponse {
        jobs: page.rows.into_iter().map(|r| ListedJob(views::job(r))).collect(),
        next_cursor: page.next.map(|last| state.tokens.mint_cursor(last, &scope)),
    };
    let jobs = answer.jobs.len();
    Ok(views::JobsJson { value: answer, jobs })
}

/// `POST /v1/jobs/bulk`: retry, cancel or delete every job of a queue in
/// the given states (and of `ids`, created before `created_before`), each
/// by its single-job rule (admin only).
pub async fn bulk(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<BulkJobsRequest>,
) -> Result<Json<BulkJobsResponse>, ApiError> {
    require(&caller, Action::Bulk)?;
    if !caller.may_use_queue(&req.queue) {
        return Err(ApiError::forbidden_queue(req.queue.as_str()));
    }
    if req.states.is_empty() {
        return Err(ApiError::invalid(
            "states must name at least one state: a bulk action never applies to every job",
        ));
    }
    if req.ids.as_ref().is_some_and(|ids| ids.len() > MAX_BULK_IDS) {
        return Err(ApiError::invalid(format!(
            "ids may name at most {MAX_BULK_IDS} jobs; send several requests, or filter by states and created_before"
        )));
    }
    let action = match req.action {
        BulkActionName::Retry => BulkAction::Retry,
        BulkActionName::Cancel => BulkAction::Cancel,
        BulkActionName::Delete => BulkAction::Delete,
    };
    let mut states = req.states;
    states.sort_unstable_by_key(|s| JobState::ALL.iter().position(|a| a == s));
    states.dedup();
    let filter = JobFilter {
        queue: req.queue,
        states,
        created_before: req.created_before,
    };
    let changed_counter = state
        .metrics
        .bulk_changed
        .get_or_create(&ActionLabels {
            action: action.as_str().to_owned(),
        })
        .clone();
    let report = state
        .store
        .bulk(action, &filter, req.ids.as_deref(), |changed: &[JobChange]| {
            changed_counter.inc_by(changed.len() as u64);
            announce_bulk(&state, action, changed);
        })
        .await?;
    tracing::info!(
        action = action.as_str(),
        queue = %filter.queue,
        matched = report.matched,
        changed = report.changed,
        "bulk action"
    );
    Ok(Json(BulkJobsResponse {
        matched: report.matched,
        changed: report.changed,
    }))
}

/// Metrics and wake-ups of one committed chunk of a bulk action.
fn announce_bulk(state: &AppState, action: BulkAction, changed: &[JobChange]) {
    match action {
        BulkAction::Retry => {
            if let Some(first) = changed.first() {
                state.wake.ready(&first.queue);
            }
        }
        BulkAction::Cancel => {
            for job in changed.iter().filter(|j| j.state.is_terminal()) {
                if let Some(created) = job.created_at {
                    state.metrics.transition_of(
                        job.queue.as_str(),
                        job.state,
                        created,
                        job.finished_at,
                        Via::Cancel,
                    );
                }
                state.wake.terminal(job.id);
            }
        }
        BulkAction::Delete => {}
    }
}

/// `GET /v1/queues/{queue}`: one queue's figures and settings (a queue
/// without jobs or settings answers zeros and the defaults).
pub async fn get_queue(
    State(state): State<AppState>,
    caller: Caller,
    QueuePath(queue): QueuePath,
) -> Result<Json<QueueSummary>, ApiError> {
    require_for_queue(&caller, Action::Read, &queue)?;
    figures_of(&state, &queue).await.map(Json)
}

async fn figures_of(state: &AppState, queue: &QueueName) -> Result<QueueSummary, ApiError> {
    Ok(queue_summary(state.figures.queue(queue).await?))
}

fn check_limit(name: &str, value: Option<Option<i32>>) -> Result<(), ApiError> {
    match value {
        Some(Some(v)) if !(1..=MAX_RUNNING_LIMIT).contains(&v) => Err(ApiError::invalid(format!(
            "{name} must be between 1 and {MAX_RUNNING_LIMIT} (null removes the limit)"
        ))),
        _ => Ok(()),
    }
}

fn check_retention(name: &str, value: Option<Option<i64>>) -> Result<(), ApiError> {
    match value {
        Some(Some(v)) if !(0..=MAX_RETENTION_MS).contains(&v) => Err(ApiError::invalid(format!(
            "{name} must be between 0 (keep forever) and {MAX_RETENTION_MS} ms (null: the coordinator's default)"
        ))),
        _ => Ok(()),
    }
}

/// Checks an endpoint as it is set: where it may point, its timeout and
/// its concurrency.
fn endpoint_setting(state: &AppState, set: SetEndpoint) -> Result<EndpointSetting, ApiError> {
    let url = state
        .endpoint_allow
        .check_url(&set.url)
        .map_err(ApiError::invalid)?;
    let timeout_ms = set.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
    if !(MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS).contains(&timeout_ms) {
        return Err(ApiError::invalid(format!(
            "endpoint.timeout_ms must be between {MIN_TIMEOUT_MS} and {MAX_TIMEOUT_MS} (default {DEFAULT_TIMEOUT_MS})"
        )));
    }
    let concurrency = set.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
    if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
        return Err(ApiError::invalid(format!(
            "endpoint.concurrency must be between 1 and {MAX_CONCURRENCY} (default {DEFAULT_CONCURRENCY})"
        )));
    }
    Ok(EndpointSetting {
        url: url.to_string(),
        timeout_ms: timeout_ms as i32,
        concurrency: concurrency as i32,
    })
}

/// Checks the retry policy and dead-letter queue of a change of `queue`'s
/// settings.
fn check_retry_settings(queue: &QueueName, req: &UpdateQueueRequest) -> Result<(), ApiError> {
    if let Some(Some(n)) = req.max_attempts {
        retry::check_max_attempts(n).map_err(ApiError::invalid)?;
    }
    if let Some(Some(backoff)) = &req.backoff {
        backoff.check().map_err(ApiError::invalid)?;
    }
    if let Some(Some(window)) = req.retry_window_ms {
        retry::check_retry_window(window).map_err(ApiError::invalid)?;
    }
    if let Some(Some(dead_letter)) = &req.dead_letter_queue
        && dead_letter == queue
    {
        return Err(ApiError::invalid(
            "dead_letter_queue must name another queue than the queue itself",
        ));
    }
    Ok(())
}

/// Checks a settings change; the error says which field is wrong and why.
fn settings_change(state: &AppState, req: UpdateQueueRequest) -> Result<SettingsChange, ApiError> {
    let endpoint = match req.endpoint {
        Some(Some(set)) => Some(Some(endpoint_setting(state, set)?)),
        Some(None) => Some(None),
        None => None,
    };
    let paused = match req.paused {
        Some(None) => return Err(ApiError::invalid("paused must be true or false")),
        Some(Some(p)) => Some(p),
        None => None,
    };
    check_limit("max_running", req.max_running)?;
    check_limit("max_running_per_key", req.max_running_per_key)?;
    check_retention("retention_done_ms", req.retention_done_ms)?;
    check_retention("retention_failed_ms", req.retention_failed_ms)?;
    if let Some(Some(rate)) = req.rate_limit {
        if !(rate.per_s.is_finite() && rate.per_s >= MIN_RATE_PER_S && rate.per_s <= f64::from(MAX_RATE)) {
            return Err(ApiError::invalid(format!(
                "rate_limit.per_s must be between {MIN_RATE_PER_S} and {MAX_RATE} (null removes the limit)"
            )));
        }
        if !(1..=MAX_RATE).contains(&rate.burst) {
            return Err(ApiError::invalid(format!(
                "rate_limit.burst must be between 1 and {MAX_RATE}"
            )));
        }
    }
    Ok(SettingsChange {
        paused,
        max_running: req.max_running,
        max_running_per_key: req.max_running_per_key,
        rate_limit: req.rate_limit.map(|r| {
            r.map(|r| RateLimit {
                per_s: r.per_s,
                burst: r.burst,
            })
        }),
        retention_done_ms: req.retention_done_ms,
        retention_failed_ms: req.retention_failed_ms,
        endpoint,
        max_attempts: req.max_attempts,
        backoff: req.backoff,
        retry_window_ms: req.retry_window_ms,
        dead_letter_queue: req.dead_letter_queue,
    })
}

/// `PATCH /v1/queues/{queue}`: changes a queue's settings (admin only);
/// answers its figures and settings after the change. Settings apply on
/// every replica at once: claims read the pause from PostgreSQL.
pub async fn update_queue(
    State(state): State<AppState>,
    caller: Caller,
    QueuePath(queue): QueuePath,
    JsonBody(req): JsonBody<UpdateQueueRequest>,
) -> Result<Json<QueueSummary>, ApiError> {
    require_for_queue(&caller, Action::Configure, &queue)?;
    check_retry_settings(&queue, &req)?;
    if let Some(Some(dead_letter)) = &req.dead_letter_queue {
        // Its follow-ups are enqueued there: the key must reach it too.
        require_for_queue(&caller, Action::Configure, dead_letter)?;
    }
    let change = settings_change(&state, req)?;
    if change == SettingsChange::default() {
        // Nothing to change: answer as GET would, and create no settings.
        return figures_of(&state, &queue).await.map(Json);
    }
    let settings = state.store.update_queue_settings(&queue, &change).await?;
    state.flow.note(&queue, &settings);
    state
        .metrics
        .settings_changes
        .get_or_create(&QueueLabels {
            queue: queue.to_string(),
        })
        .inc();
    tracing::info!(%queue, ?change, "queue settings changed");
    if !settings.paused {
        // A resume (or a raised limit): parked claims on every replica look again.
        state.wake.ready(&queue);
    }
    figures_of(&state, &queue).await.map(Json)
}

/// The wire form of an endpoint's secrets.
fn secret_response(keys: EndpointKeys) -> EndpointSecretResponse {
    let (previous_secret, previous_expires_at) = keys.previous.map(|(s, at)| (s.0, at)).unzip();
    EndpointSecretResponse {
        secret: keys.secret.0,
        previous_secret,
        previous_expires_at,
    }
}

fn no_secret(queue: &QueueName) -> ApiError {
    ApiError::new(
        ErrorCode::NotFound,
        format!(
            "queue {queue} has no endpoint secret: set an endpoint first (PATCH /v1/queues/{{queue}} with endpoint)"
        ),
    )
}

/// `GET /v1/queues/{queue}/endpoint-secret`: the secrets that sign the
/// requests to the queue's endpoint (admin only).
pub async fn endpoint_secret(
    State(state): State<AppState>,
    caller: Caller,
    QueuePath(queue): QueuePath,
) -> Result<Json<EndpointSecretResponse>, ApiError> {
    require_for_queue(&caller, Action::Configure, &queue)?;
    let keys = state
        .store
        .queue_settings_of(&queue)
        .await?
        .and_then(|s| s.endpoint_keys);
    keys.map(|k| Json(secret_response(k)))
        .ok_or_else(|| no_secret(&queue))
}

/// `POST /v1/queues/{queue}/endpoint-secret/rotate`: a new secret signs
/// from now on; the previous one keeps signing beside it for
/// `RUNLEASE_ENDPOINT_ROTATION_MS` (admin only).
pub async fn rotate_endpoint_secret(
    State(state): State<AppState>,
    caller: Caller,
    QueuePath(queue): QueuePath,
) -> Result<Json<EndpointSecretResponse>, ApiError> {
    require_for_queue(&caller, Action::Configure, &queue)?;
    let new = crate::endpoint::sign::new_secret();
    let keys = state
        .store
        .rotate_endpoint_secret(&queue, &new, state.endpoint_rotation)
        .await?
        .ok_or_else(|| no_secret(&queue))?;
    tracing::info!(%queue, "endpoint secret rotated");
    // Every coordinator signs with both from its next view refresh; this one at once.
    if let Err(e) = state.flow.refresh().await {
        tracing::warn!(error = %e, "cannot refresh the queue settings after a rotation");
    }
    Ok(Json(secret_response(keys)))
}
