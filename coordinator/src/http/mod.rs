//! The v1 HTTP protocol on axum.
//!
//! - [`error`]: `ApiError`, the one error body.
//! - [`extract`]: JSON, path, query and caller extractors that answer with it.
//! - [`jobs`]: producer endpoints.
//! - [`dependencies`]: the dependencies of an enqueue's jobs, checked.
//! - [`leases`]: worker endpoints: claim, heartbeat.
//! - [`finish`]: complete, fail, release and finish.
//! - [`ops`]: health, readiness, metrics, queue figures, `/openapi.yaml`.
//! - [`admin`]: job listing, bulk actions, one queue's figures and settings.
//! - [`schedules`]: cron schedules.
//! - [`views`]: the store's rows as protocol answers.
//! - [`ui`]: the web dashboard's built-in files.
//! - [`origin`]: open mode's guard against web pages (Host, Origin).
//! - [`serve`]: the accept loop: connection cap, header and idle deadlines.

pub mod admin;
pub mod dependencies;
pub mod error;
pub mod extract;
pub mod finish;
pub mod h1;
pub mod jobs;
pub mod leases;
pub mod ops;
pub mod origin;
pub mod schedules;
pub mod serve;
pub mod ui;
pub mod views;
mod watch;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use runlease_protocol::{ErrorCode, routes};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::auth::ApiKeys;
use crate::batch::claims::ClaimBatcher;
use crate::batch::{Finisher, Renewer};
use crate::limits::ParkLimit;
use crate::metrics::{Metrics, RefusedLabels, RouteLabels};
use crate::store::Store;
use crate::token::TokenKey;
use crate::wake::Wake;
use error::ApiError;

/// Shared state of every handler, behind one `Arc`: axum hands each request
/// its own clone.
pub type AppState = Arc<Shared>;

/// What [`AppState`] holds.
pub struct Shared {
    /// PostgreSQL.
    pub store: Store,
    /// Lease-token key.
    pub tokens: TokenKey,
    /// API keys (empty: open, loopback only).
    pub keys: Arc<ApiKeys>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Wake-ups (local, and Redis between coordinators).
    pub wake: Wake,
    /// How often a parked long-poll re-checks PostgreSQL without a wake-up.
    pub recheck: Duration,
    /// Cancelled at shutdown: parked long-polls answer at once.
    pub shutdown: CancellationToken,
    /// Which queues have flow-control limits.
    pub flow: Arc<crate::flow::FlowControl>,
    /// Serves claims (one statement for a queue's parked claimers).
    pub claims: ClaimBatcher,
    /// Writes single-job enqueues in shared statements.
    pub enqueuer: crate::batch::Enqueuer,
    /// Writes complete, fail and release outcomes in shared statements.
    pub finisher: Finisher,
    /// Writes lease renewals in shared statements.
    pub renewer: Renewer,
    /// Places for parked claims, per key and in all.
    pub parked_claims: ParkLimit,
    /// Places for parked job reads, per key and in all.
    pub parked_reads: ParkLimit,
    /// Most bytes of jobs in one listing or claim answer.
    pub max_answer_bytes: usize,
    /// Hosts an endpoint may reach although they are internal.
    pub endpoint_allow: Arc<crate::endpoint::guard::AllowList>,
    /// How long a rotated endpoint secret keeps signing.
    pub endpoint_rotation: Duration,
    /// Queue figures of `/metrics` and `/v1/queues`, read in the background
    /// while reading them is slow.
    pub figures: Arc<crate::figures::QueueFiguresCache>,
}

impl Shared {
    /// The state of a coordinator's handlers: its batchers started on
    /// `tracker` (they stop with `shutdown`), its limits and timers as
    /// `config` sets them.
    pub fn new(
        parts: &crate::batch::Parts,
        config: &crate::config::Config,
        tokens: TokenKey,
        keys: ApiKeys,
        tracker: &tokio_util::task::TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let settings = config.batching.settings();
        tracing::info!(?settings, "batching");
        let recheck = config.leases.claim_recheck;
        let crate::batch::Parts {
            store,
            wake,
            flow,
            metrics,
        } = parts;
        let figures = Arc::new(crate::figures::QueueFiguresCache::new(
            store.clone(),
            crate::figures::Tuning::default(),
        ));
        tracker.spawn(figures.clone().run(shutdown.clone()));
        let claims = ClaimBatcher::spawn(parts, settings, recheck, tracker, shutdown.clone());
        Self {
            figures,
            enqueuer: crate::batch::enqueue::enqueuer(
                parts,
                settings,
                claims.clone(),
                tracker,
                shutdown.clone(),
            ),
            claims,
            finisher: Finisher::finisher(parts, settings, tracker, shutdown.clone()),
            renewer: Renewer::renewer(store, settings, metrics.clone(), tracker, shutdown.clone()),
            store: store.clone(),
            tokens,
            keys: Arc::new(keys),
            metrics: metrics.clone(),
            wake: wake.clone(),
            recheck,
            shutdown,
            flow: flow.clone(),
            parked_claims: config.limits.parked_claims(),
            parked_reads: config.limits.parked_reads(),
            max_answer_bytes: config.limits.max_answer_bytes,
            endpoint_allow: Arc::new(crate::endpoint::guard::AllowList::parse(
                config.endpoints.allow_hosts.as_deref().unwrap_or_default(),
            )),
            endpoint_rotation: config.endpoints.rotation,
        }
    }

    /// A place for a parked claim of `caller` of `shape` (a hash of its
    /// queues and time-left band), or 429.
    pub fn park_claim(
        &self,
        caller: &crate::auth::Caller,
        shape: u64,
    ) -> Result<crate::limits::Parking, ApiError> {
        let parked = self.parked_claims.park_shaped(caller.key, shape);
        self.refused_if(parked, "parked_claims")
    }

    /// A place for a parked job read of `caller`, or 429.
    pub fn park_read(&self, caller: &crate::auth::Caller) -> Result<crate::limits::Parking, ApiError> {
        self.refused_if(self.parked_reads.park(caller.key), "parked_reads")
    }

    /// A refused place as 429, counted under `limit`.
    fn refused_if(
        &self,
        parked: Result<crate::limits::Parking, crate::limits::ParkRefused>,
        limit: &'static str,
    ) -> Result<crate::limits::Parking, ApiError> {
        parked.map_err(|refused| {
            self.metrics
                .requests_refused
                .get_or_create(&RefusedLabels { limit })
                .inc();
            ApiError::too_many(refused.0)
        })
    }
}

/// The router with every route of the v1 protocol.
pub fn app(state: AppState, max_body_bytes: usize) -> Router {
    Router::new()
        .route(routes::JOBS, post(jobs::enqueue).get(admin::list_jobs))
        .route(routes::JOBS_BULK, post(admin::bulk))
        .route(routes::JOBS_BATCH, post(jobs::enqueue_batch))
        .route(routes::JOB, get(jobs::get_job))
        .route(routes::JOB_ATTEMPTS, get(jobs::list_attempts))
        .route(routes::JOB_CANCEL, post(jobs::cancel))
        .route(routes::JOB_RETRY, post(jobs::retry))
        .route(routes::CLAIM, post(leases::claim))
        .route(routes::HEARTBEAT, post(leases::heartbeat))
        .route(routes::COMPLETE, post(finish::complete))
        .route(routes::FAIL, post(finish::fail))
        .route(routes::RELEASE, post(finish::release))
        .route(routes::FINISH, post(finish::finish))
        .route(routes::QUEUES, get(ops::queues))
        .route(routes::QUEUE, get(admin::get_queue).patch(admin::update_queue))
        .route(routes::QUEUE_ENDPOINT_SECRET, get(admin::endpoint_secret))
        .route(
            routes::QUEUE_ENDPOINT_SECRET_ROTATE,
            post(admin::rotate_endpoint_secret),
        )
        .route(routes::SCHEDULES, get(schedules::list))
        .route(
            routes::SCHEDULE,
            get(schedules::get).put(schedules::put).delete(schedules::delete),
        )
        .route(routes::HEALTHZ, get(ops::healthz))
        .route(routes::READYZ, get(ops::readyz))
        .route(routes::METRICS, get(ops::metrics))
        .route(routes::OPENAPI, get(ops::openapi))
        .route(routes::WHOAMI, get(ops::whoami))
        .route(routes::UI, get(ui::page))
        .route("/ui/", get(ui::page))
        .route(routes::UI_ASSET, get(ui::asset))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::new(ErrorCode::NotFound, "no such route; see docs/protocol.md")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "this route does not take this method; see docs/protocol.md",
    )
}

/// The metric and log label of an HTTP method: the standard methods by
/// name, anything else as `other`.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::TRACE => "TRACE",
        Method::CONNECT => "CONNECT",
        _ => "other",
    }
}

/// A span per request (job handlers record `job_id` and `run_lease` in it,
/// and the job's trace context when it has one; a `traceparent` header puts
/// the span in the caller's trace) and its duration per route.
async fn observe(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("unmatched", |p| p.as_str())
        .to_owned();
    // A fixed set: a made-up method (any token, of any length, before any
    // auth) must not become a metric series or a log field of its own.
    let method = method_label(request.method());
    let span = tracing::info_span!(
        "request",
        %method,
        %route,
        job_id = tracing::field::Empty,
        run_lease = tracing::field::Empty,
        status = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        traceparent = tracing::field::Empty,
    );
    if let Some(traceparent) = extract::TraceContext::from_headers(request.headers()) {
        crate::telemetry::join_trace(&span, &traceparent);
    }
    let started = Instant::now();
    // Open mode's guard here rather than in a middleware of its own: one
    // boxed future less held by every request in flight (a parked claim's
    // for up to a minute).
    let response = match span.in_scope(|| origin::refusal(&state, &request)) {
        Some(refused) => refused,
        None => next.run(request).instrument(span.clone()).await,
    };
    let status = response.status();
    span.record("status", status.as_u16());
    let class = format!("{}xx", status.as_u16() / 100);
    state
        .metrics
        .request_duration
        .get_or_create(&RouteLabels {
            route,
            method: method.to_owned(),
            status: class,
        })
        .observe(started.elapsed().as_secs_f64());
    if response.extensions().get::<error::DbUnavailable>().is_some() {
        state.metrics.db_unavailable.inc();
    }
    if status.is_server_error() {
        tracing::warn!(parent: &span, status = status.as_u16(), "request answered with a server error");
    }
    response.into_response()
}
