//! The runlease coordinator: owns PostgreSQL and hands out fenced job leases
//! to workers over HTTP. Workers never touch the database; every guarantee
//! (one running attempt per job, stale writes refused, expired leases taken
//! back) is a guarded statement in PostgreSQL.
//!
//! Layout:
//! - [`config`]: settings (flags and `RUNLEASE_*` variables).
//! - [`cron`]: cron expressions of schedules, in a time zone.
//! - [`store`]: PostgreSQL: connection, migrations, the SQL statements.
//! - [`dispatch`]: SQS wake-ups that start Lambda workers.
//! - [`endpoint`]: HTTP endpoints as workers: the coordinator pushes jobs as signed requests.
//! - [`flow`]: which queues have flow-control limits (the claim path they take).
//! - [`http`]: the v1 protocol on axum.
//! - [`token`]: lease tokens (HMAC-SHA256).
//! - [`auth`]: API keys and roles.
//! - [`limits`]: connections, parked long-polls and answer sizes a caller may use.
//! - [`reaper`]: takes back expired leases.
//! - [`floor_check`]: now and then, a full scan checks the claim floors.
//! - [`prune`]: retention: deletes terminal jobs past their queue's retention.
//! - [`scheduler`]: the schedule loop: one job per fire time.
//! - [`settled`]: wake-ups and metrics of jobs whose dependencies settled.
//! - [`batch`]: gathering claims, heartbeats and finishes into shared statements.
//! - [`wake`]: wake-ups of parked long-polls (local, Redis) and the repair loop.
//! - [`metrics`]: Prometheus metrics (queue labels capped).
//! - [`telemetry`]: log output, trace context, the optional OTLP exporter.

/// Logs one job's routine transition (enqueued, claimed, finished): at
/// `info` when `$loud` (the job carries trace context, or the transition is
/// a failure worth reading), otherwise at `debug`. One line per job at every
/// claim and finish was a sixth of the coordinator's CPU at 30,000 jobs/s;
/// the counters in `/metrics` count every transition either way.
macro_rules! job_event {
    ($loud:expr, $($arg:tt)+) => {
        if $loud {
            tracing::info!($($arg)+)
        } else {
            tracing::debug!($($arg)+)
        }
    };
}

pub mod auth;
pub mod batch;
pub mod config;
pub mod cron;
pub mod dispatch;
pub mod endpoint;
pub mod figures;
pub mod floor_check;
pub mod flow;
pub mod http;
pub mod limits;
pub mod metrics;
pub mod prune;
pub mod reaper;
pub mod scheduler;
pub mod settled;
pub mod store;
pub mod telemetry;
pub mod token;
pub mod wake;

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::ApiKeys;
use crate::config::Config;
use crate::floor_check::FloorCheck;
use crate::flow::FlowControl;
use crate::metrics::Metrics;
use crate::prune::Pruner;
use crate::reaper::Reaper;
use crate::scheduler::Scheduler;
use crate::store::connect::DatabaseTarget;
use crate::store::{Store, StoreError};
use crate::token::TokenKey;
use crate::wake::Wake;
use crate::wake::repair::Repairer;

/// Why the coordinator could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is wrong; the message says which and how to fix it.
    #[error("configuration: {0}")]
    Config(String),
    /// PostgreSQL could not be reached, set up or migrated.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The listener failed.
    #[error("cannot serve HTTP: {0}")]
    Io(#[from] std::io::Error),
}

/// Connects to PostgreSQL (creating the database if missing) and applies
/// pending migrations.
pub async fn connect_and_migrate(config: &Config) -> Result<Store, Error> {
    let target = DatabaseTarget::parse(&config.database.url)?;
    if target.create_database_if_missing().await? {
        tracing::info!(database = target.dbname(), "created the database");
    }
    let deadlines = config.database.deadlines();
    let pool = target.pool(config.database.pool_size, deadlines)?;
    let applied = store::migrate::migrate(&pool).await?;
    if !applied.is_empty() {
        tracing::info!(?applied, "applied migrations");
    }
    Ok(Store::new(pool, config.leases.terms(), deadlines.call))
}

/// `runlease-coordinator migrate`.
pub async fn migrate(config: &Config) -> Result<(), Error> {
    let mut config = config.clone();
    config.load_secret_files().map_err(Error::Config)?;
    connect_and_migrate(&config).await.map(drop)
}

/// Binds `RUNLEASE_LISTEN` and serves until `shutdown` fires.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), Error> {
    let listener = TcpListener::bind(config.server.listen).await?;
    serve(config, listener, shutdown).await
}

/// Serves the protocol on `listener` until `shutdown` fires, then stops
/// accepting, answers parked long-polls, finishes in-flight requests and
/// stops the background loops.
pub async fn serve(
    mut config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    config.load_secret_files().map_err(Error::Config)?;
    config.validate().map_err(Error::Config)?;
    let addr = listener.local_addr()?;
    let keys = api_keys(&config, addr)?;
    let tokens = token_key(&config);
    let metrics = Arc::new(Metrics::with_max_queues(
        config.server.slo,
        config.server.metrics_max_queues,
    ));
    let (settled_sink, settled) = tokio::sync::mpsc::unbounded_channel();
    let store = connect_and_migrate(&config)
        .await?
        .count_timeouts_in(metrics.db_timeouts.clone())
        .count_retries_in(metrics.db_retries.clone())
        .report_settled_to(settled_sink);
    let tracker = TaskTracker::new();
    let wake = connect_redis(&config, &metrics, &tracker, &shutdown)?;
    let store = store.with_claim_floors(wake.claim_floors());
    tracker.spawn(settled::run(
        settled,
        wake.clone(),
        metrics.clone(),
        shutdown.child_token(),
    ));
    let flow = FlowControl::new(store.clone(), wake.clone(), metrics.clone());
    let parts = batch::Parts {
        store,
        wake,
        flow,
        metrics,
    };
    start_loops(&config, &parts, &tracker, &shutdown).await?;
    let admits: http::serve::Admits = {
        let keys = keys.clone();
        Arc::new(move |fields| keys.admits(fields))
    };
    let state = Arc::new(http::Shared::new(
        &parts,
        &config,
        tokens,
        keys,
        &tracker,
        shutdown.clone(),
    ));
    let endpoints = endpoint::Endpoints::new(
        state.clone(),
        endpoint::Settings::from_config(&config.endpoints, addr),
    )
    .map_err(Error::Config)?;
    tracker.spawn(endpoints.run(tracker.clone(), shutdown.child_token()));
    tracing::info!(%addr, "runlease coordinator listening");
    let app = http::app(state, config.server.max_body_bytes);
    http::serve::serve(
        listener,
        app,
        config.limits.connections(config.server.max_body_bytes),
        admits,
        parts.metrics.clone(),
        shutdown,
    )
    .await;
    tracker.close();
    tracker.wait().await;
    tracing::info!("runlease coordinator stopped");
    Ok(())
}

/// The API keys; with none, serving is allowed on loopback only.
fn api_keys(config: &Config, addr: std::net::SocketAddr) -> Result<ApiKeys, Error> {
    let keys = ApiKeys::parse(config.keys.api_keys.as_deref().unwrap_or_default()).map_err(Error::Config)?;
    if keys.is_empty() {
        if !addr.ip().is_loopback() {
            return Err(Error::Config(format!(
                "no RUNLEASE_API_KEYS configured and listening on {addr}, which is not a loopback address; set RUNLEASE_API_KEYS or listen on 127.0.0.1"
            )));
        }
        tracing::warn!(%addr, "no RUNLEASE_API_KEYS configured: serving unauthenticated requests on loopback only");
    }
    Ok(keys)
}

/// The lease-token key: `RUNLEASE_SECRET`'s, or a random one.
fn token_key(config: &Config) -> TokenKey {
    let mut secrets = config.secrets();
    if secrets.is_empty() {
        let mut bytes = [0u8; 32];
        rand::fill(&mut bytes);
        tracing::warn!(
            "RUNLEASE_SECRET is not set: generated a random one; leases handed out by this process will not verify after a restart or on other replicas"
        );
        secrets.push(bytes.to_vec());
    } else if secrets.len() > 1 {
        tracing::info!(
            keys = secrets.len(),
            "lease tokens are signed with the first RUNLEASE_SECRET key and verified with every one"
        );
    }
    if config.keys.lease_token_version == 1 {
        tracing::warn!(
            "RUNLEASE_LEASE_TOKEN_VERSION=1: minting lease tokens older coordinators verify; their queue is not checked against keys limited to some queues. Set 2 once every replica runs this version"
        );
    }
    TokenKey::rotating(&secrets.iter().map(Vec::as_slice).collect::<Vec<_>>())
        .minting(config.keys.lease_token_version)
}

/// Wake-ups: through Redis, or inside this coordinator only when
/// `RUNLEASE_REDIS_URL` is empty.
fn connect_redis(
    config: &Config,
    metrics: &Arc<Metrics>,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<Wake, Error> {
    if config.redis.url.trim().is_empty() {
        tracing::info!("RUNLEASE_REDIS_URL is empty: wake-ups stay inside this coordinator");
        return Ok(Wake::local_only());
    }
    Wake::with_redis(
        &config.redis.url,
        &config.redis.prefix,
        metrics.clone(),
        tracker,
        shutdown.child_token(),
    )
    .map_err(Error::Config)
}

/// Starts the background loops: the reaper, the repair of wake-ups, the
/// pruner, the scheduler, the flow-control view and SQS dispatch.
async fn start_loops(
    config: &Config,
    parts: &batch::Parts,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<(), Error> {
    let batch::Parts {
        store,
        wake,
        flow,
        metrics,
    } = parts;
    let reaper = Reaper::new(
        store.clone(),
        metrics.clone(),
        wake.clone(),
        config.leases.reaper_interval,
    );
    tracker.spawn(reaper.run(shutdown.child_token()));
    let repairer = Repairer::new(
        store.clone(),
        wake.clone(),
        metrics.clone(),
        config.redis.repair_interval,
    );
    tracker.spawn(repairer.run(shutdown.child_token()));
    let pruner = Pruner::new(
        store.clone(),
        metrics.clone(),
        config.retention.clone(),
        shutdown.child_token(),
    );
    tracker.spawn(pruner.run());
    let floor_check = FloorCheck::new(store.clone(), metrics.clone(), config.leases.claim_recheck);
    tracker.spawn(floor_check.run(shutdown.child_token()));
    let scheduler = Scheduler::new(store.clone(), wake.clone(), metrics.clone());
    tracker.spawn(scheduler.run(shutdown.child_token()));
    if let Err(e) = flow.refresh().await {
        tracing::warn!(error = %e, "cannot read queue settings yet; retrying every second");
    }
    tracker.spawn(flow.clone().run(shutdown.child_token()));
    // A build without the `sqs` feature refused SQS bindings in `validate`.
    #[cfg(feature = "sqs")]
    {
        let bindings = dispatch::parse_bindings(config.sqs.queues.as_deref().unwrap_or_default())
            .map_err(Error::Config)?;
        if !bindings.is_empty() {
            start_dispatch(&config.sqs, bindings, parts, tracker, shutdown).await;
        }
    }
    Ok(())
}

/// Starts the SQS dispatcher for `bindings` (not empty).
#[cfg(feature = "sqs")]
async fn start_dispatch(
    sqs: &config::SqsConfig,
    bindings: std::collections::HashMap<runlease_protocol::QueueName, String>,
    parts: &batch::Parts,
    tracker: &TaskTracker,
    shutdown: &CancellationToken,
) {
    let client = dispatch::Dispatcher::sqs_client(sqs.endpoint.as_deref()).await;
    let dispatcher = dispatch::Dispatcher::new(
        parts.store.clone(),
        client,
        bindings,
        sqs.jobs_per_wakeup,
        sqs.dispatch_interval,
        parts.metrics.clone(),
    );
    tracing::info!(queues = ?sqs.queues, "SQS wake-ups for Lambda workers");
    tracker.spawn(dispatcher.run(parts.wake.clone(), shutdown.child_token()));
}

/// Starts tracing (see [`telemetry::init`]); keep the answer until exit.
pub fn init_tracing(json: bool) -> telemetry::Telemetry {
    telemetry::init(json)
}
