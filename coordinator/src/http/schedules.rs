//! Schedule endpoints: `PUT`/`GET`/`DELETE /v1/schedules/{name}`, `GET /v1/schedules`.

use axum::Json;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use runlease_protocol::ErrorCode;
use runlease_protocol::limits::{MAX_ATTEMPTS_LIMIT, MAX_SCHEDULE_NAME_LEN, MAX_TIMEOUT_MS, storable_json};
use runlease_protocol::schedules::{ListSchedulesResponse, PutScheduleRequest, Schedule};

use crate::auth::{Action, Caller};
use crate::cron::CronSpec;
use crate::http::AppState;
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, require};
use crate::store::schedules::{NewSchedule, ScheduleDefinition, ScheduleRow};

/// A schedule name from the path: 1 to 128 bytes, no control characters.
pub struct ScheduleName(pub String);

impl<S: Send + Sync> FromRequestParts<S> for ScheduleName {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|r| ApiError::bad_request(r.body_text()))?;
        if raw.is_empty() || raw.len() > MAX_SCHEDULE_NAME_LEN || raw.chars().any(char::is_control) {
            return Err(ApiError::invalid(format!(
                "a schedule name is 1 to {MAX_SCHEDULE_NAME_LEN} bytes without control characters"
            )));
        }
        Ok(ScheduleName(raw))
    }
}

fn view(row: ScheduleRow) -> Schedule {
    let d = row.definition;
    Schedule {
        name: d.name,
        queue: d.queue,
        cron: d.cron,
        timezone: d.timezone,
        payload: d.payload,
        priority: d.priority,
        max_attempts: d.max_attempts,
        timeout_ms: d.timeout_ms,
        next_fire_at: (!d.paused).then_some(row.next_fire_at),
        paused: d.paused,
        last_fired_at: row.last_fired_at,
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such schedule")
}

/// `PUT /v1/schedules/{name}` (admin): 201 with a new schedule, 200 with a
/// replaced one; its next fire time is the first after now.
pub async fn put(
    State(state): State<AppState>,
    caller: Caller,
    ScheduleName(name): ScheduleName,
    JsonBody(req): JsonBody<PutScheduleRequest>,
) -> Result<(StatusCode, Json<Schedule>), ApiError> {
    require(&caller, Action::Configure)?;
    if !caller.may_use_queue(&req.queue) {
        return Err(ApiError::forbidden_queue(req.queue.as_str()));
    }
    // A key limited to some queues may not take over (or even learn of) a
    // schedule of another queue by putting one of the same name.
    if caller.queues.is_some()
        && let Some(existing) = state.store.schedules(Some(&name)).await?.pop()
        && !caller.may_use_queue(&existing.definition.queue)
    {
        return Err(not_found());
    }
    let timezone = req.timezone.unwrap_or_else(|| "UTC".to_owned());
    let spec = CronSpec::parse(&req.cron, &timezone).map_err(ApiError::invalid)?;
    if !storable_json(&req.payload) {
        return Err(ApiError::invalid(
            "payload must not contain a NUL character (\\u0000)",
        ));
    }
    if let Some(n) = req.max_attempts
        && !(1..=MAX_ATTEMPTS_LIMIT).contains(&n)
    {
        return Err(ApiError::invalid(format!(
            "max_attempts must be between 1 and {MAX_ATTEMPTS_LIMIT}"
        )));
    }
    if let Some(t) = req.timeout_ms
        && !(1..=MAX_TIMEOUT_MS).contains(&t)
    {
        return Err(ApiError::invalid(format!(
            "timeout_ms must be between 1 and {MAX_TIMEOUT_MS}"
        )));
    }
    let schedule = NewSchedule {
        definition: ScheduleDefinition {
            name,
            queue: req.queue,
            cron: req.cron,
            timezone,
            payload: req.payload,
            priority: req.priority.unwrap_or(0),
            max_attempts: req.max_attempts,
            timeout_ms: req.timeout_ms,
            paused: req.paused.unwrap_or(false),
        },
        spec,
    };
    let (row, created) = state.store.put_schedule(&schedule).await?;
    let d = &row.definition;
    tracing::info!(schedule = %d.name, cron = %d.cron, timezone = %d.timezone, created, "schedule set");
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(view(row))))
}

/// `GET /v1/schedules`: every schedule the key may see, by name.
pub async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<ListSchedulesResponse>, ApiError> {
    require(&caller, Action::Read)?;
    let rows = state.store.schedules(None).await?;
    Ok(Json(ListSchedulesResponse {
        schedules: rows
            .into_iter()
            .filter(|r| caller.may_use_queue(&r.definition.queue))
            .map(view)
            .collect(),
    }))
}

/// `GET /v1/schedules/{name}`.
pub async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ScheduleName(name): ScheduleName,
) -> Result<Json<Schedule>, ApiError> {
    require(&caller, Action::Read)?;
    match state.store.schedules(Some(&name)).await?.pop() {
        Some(row) if caller.may_use_queue(&row.definition.queue) => Ok(Json(view(row))),
        _ => Err(not_found()),
    }
}

/// `DELETE /v1/schedules/{name}` (admin): answers the schedule as it was;
/// the jobs it enqueued stay.
pub async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    ScheduleName(name): ScheduleName,
) -> Result<Json<Schedule>, ApiError> {
    require(&caller, Action::Configure)?;
    if let Some(row) = state.store.schedules(Some(&name)).await?.pop()
        && !caller.may_use_queue(&row.definition.queue)
    {
        return Err(not_found());
    }
    match state.store.delete_schedule(&name).await? {
        Some(row) => {
            tracing::info!(schedule = %row.definition.name, "schedule deleted");
            Ok(Json(view(row)))
        }
        None => Err(not_found()),
    }
}
