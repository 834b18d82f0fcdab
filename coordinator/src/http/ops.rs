//! Operations endpoints: health, readiness, metrics, queue figures, the
//! OpenAPI description.

use std::collections::HashMap;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use runlease_protocol::ErrorCode;
use runlease_protocol::QueueName;
use runlease_protocol::producer::{ListQueuesResponse, WhoamiResponse};
use serde_json::json;

use crate::auth::{Action, Caller};
use crate::http::error::ApiError;
use crate::http::extract::require;
use crate::http::{AppState, admin};
use crate::metrics::{DepthLabels, QueueLabels};

/// `GET /healthz`: the process serves HTTP.
pub async fn healthz() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// The OpenAPI description of the v1 protocol, `docs/openapi.yaml`, built in.
const OPENAPI_YAML: &str = include_str!("../../../docs/openapi.yaml");

/// `GET /openapi.yaml`: the protocol's OpenAPI description (no key needed).
pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/yaml")], OPENAPI_YAML)
}

/// How long `/readyz` waits for PostgreSQL before answering 503.
pub const READY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// `GET /readyz`: PostgreSQL reachable, taking writes, and migrations
/// current (503 otherwise, within [`READY_DEADLINE`]); names the server that
/// serves (after a failover, the new primary).
pub async fn readyz(State(state): State<AppState>) -> Result<impl IntoResponse, ApiError> {
    match state.store.ready(READY_DEADLINE).await {
        Ok(ready) if !ready.writable => Err(ApiError::new(
            ErrorCode::Overloaded,
            format!(
                "the PostgreSQL server reached ({}) accepts no writes (a standby, or a failover under way); its connections are dropped and the next ones look for the primary",
                ready.server
            ),
        )),
        Ok(ready) if !ready.migrations_current => Err(ApiError::new(
            ErrorCode::Overloaded,
            "migrations are not current; run `runlease-coordinator migrate`",
        )),
        Ok(ready) => Ok(Json(json!({
            "status": "ready",
            "postgres": "ok",
            "postgres_server": ready.server,
            "migrations": "current",
            // Redis down is degraded, not down: waiters fall back to timers
            // and enqueues are repaired later.
            "redis": state.wake.redis_status().as_str(),
        }))),
        // No key is needed here, so the answer stays generic: PostgreSQL's
        // own text can name hosts, users and databases.
        Err(e) => {
            tracing::warn!(error = %e, "/readyz: PostgreSQL is not reachable");
            Err(ApiError::new(
                ErrorCode::Overloaded,
                "PostgreSQL is not reachable or did not answer in time; the coordinator's log has the details",
            ))
        }
    }
}

/// `GET /metrics`: Prometheus text. Pool use is read now; queue depth too
/// (live states from indexes over live rows, terminal ones from the
/// tallies) unless that is slow, when it is the background read's
/// ([`crate::figures`]).
pub async fn metrics(State(state): State<AppState>) -> impl IntoResponse {
    let m = &state.metrics;
    let pool = state.store.pool().status();
    m.pool_size.set(pool.size as i64);
    m.pool_available.set(pool.available as i64);
    m.pool_waiting.set(pool.waiting as i64);
    match state.figures.figures(crate::figures::Kind::Scrape).await {
        Ok(answer) => {
            m.queue_figures_age.set(answer.age.as_secs_f64());
            let queues = answer.figures;
            // Queues that are gone (their jobs deleted or pruned) must not
            // keep their last figures.
            m.depth.clear();
            m.oldest_queued_age.clear();
            // Queues past RUNLEASE_METRICS_MAX_QUEUES share one label value:
            // their depths add up and the oldest age is the oldest of them.
            let mut depth: HashMap<(String, &'static str), i64> = HashMap::new();
            let mut oldest: HashMap<String, i64> = HashMap::new();
            for q in queues.iter() {
                let label = m.queue_cap.label(q.queue.as_str());
                for (s, n) in &q.counts {
                    *depth.entry((label.to_owned(), s.as_str())).or_default() += *n;
                }
                let age = oldest.entry(label.to_owned()).or_default();
                *age = (*age).max(q.oldest_queued_age_ms.unwrap_or(0));
            }
            for ((queue, state), n) in depth {
                m.depth
                    .get_or_create(&DepthLabels {
                        queue,
                        state: state.to_owned(),
                    })
                    .set(n);
            }
            for (queue, age_ms) in oldest {
                m.oldest_queued_age
                    .get_or_create(&QueueLabels { queue })
                    .set(age_ms as f64 / 1000.0);
            }
        }
        // The rest of the metrics are still worth answering.
        Err(e) => tracing::warn!(error = %e, "cannot read queue depth for /metrics"),
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        m.render(),
    )
}

/// `GET /v1/queues`: per-queue figures (limited to the key's queues).
pub async fn queues(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<ListQueuesResponse>, ApiError> {
    require(&caller, Action::Read)?;
    let answer = state.figures.figures(crate::figures::Kind::Page).await?;
    Ok(Json(ListQueuesResponse {
        queues: answer
            .figures
            .iter()
            .filter(|q| caller.may_use_queue(&q.queue))
            .cloned()
            .map(admin::queue_summary)
            .collect(),
    }))
}

/// `GET /v1/whoami`: the caller's role and queues, so a client (the
/// dashboard) can offer only what the coordinator would allow. Without an
/// `Authorization` header it answers `role: null` instead of 401 (telling a
/// page whether to ask for a key); a key it does not know is 401 as
/// everywhere. Without keys configured the caller is the open admin.
pub async fn whoami(
    State(state): State<AppState>,
    headers: HeaderMap,
    caller: Result<Caller, ApiError>,
) -> Result<Json<WhoamiResponse>, ApiError> {
    let caller = match caller {
        Ok(caller) => caller,
        Err(_) if !headers.contains_key(header::AUTHORIZATION) => {
            return Ok(Json(WhoamiResponse {
                role: None,
                queues: None,
                keys_configured: true,
            }));
        }
        Err(e) => return Err(e),
    };
    let mut queues: Option<Vec<QueueName>> = caller
        .queues
        .as_ref()
        .map(|qs| qs.iter().filter_map(|q| QueueName::new(q.clone()).ok()).collect());
    if let Some(qs) = queues.as_mut() {
        qs.sort_unstable();
    }
    Ok(Json(WhoamiResponse {
        role: Some(caller.role.as_str().to_owned()),
        queues,
        keys_configured: !state.keys.is_empty(),
    }))
}
