//! The groups of [`super::Config`]: each part of the coordinator's settings,
//! with what converts it into what that part takes.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::{
    DEFAULT_BATCH_FLUSHERS, DEFAULT_BATCH_MAX_SIZE, DEFAULT_BATCH_PARALLEL_MIN, DEFAULT_DATABASE_POOL_SIZE,
    DEFAULT_DATABASE_URL, DEFAULT_LISTEN, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BODY_BYTES, DEFAULT_PRUNE_BATCH,
    DEFAULT_REDIS_PREFIX, DEFAULT_REDIS_URL, DEFAULT_SQS_JOBS_PER_WAKEUP,
};

/// A duration given in milliseconds, within `range` ms.
fn ms(range: std::ops::RangeInclusive<u64>) -> impl clap::builder::TypedValueParser<Value = Duration> {
    use clap::builder::TypedValueParser;
    clap::value_parser!(u64).range(range).map(Duration::from_millis)
}

/// The HTTP server, logs and metrics.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Server")]
pub struct ServerSettings {
    /// Address to listen on.
    #[arg(long, env = "RUNLEASE_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Largest request body, bytes; larger ones get 413.
    #[arg(long, env = "RUNLEASE_MAX_BODY_BYTES", default_value_t = DEFAULT_MAX_BODY_BYTES)]
    pub max_body_bytes: usize,
    /// After SIGTERM, how long in-flight requests may take before the process exits anyway, ms.
    #[arg(id = "shutdown_grace_ms", long = "shutdown-grace-ms", value_name = "SHUTDOWN_GRACE_MS", env = "RUNLEASE_SHUTDOWN_GRACE_MS", default_value = "30000", value_parser = ms(0..=u64::MAX))]
    pub shutdown_grace: Duration,
    /// A job meets the SLO when it is terminal within this many ms of enqueue.
    #[arg(id = "slo_ms", long = "slo-ms", value_name = "SLO_MS", env = "RUNLEASE_SLO_MS", default_value = "25000", value_parser = ms(0..=u64::MAX))]
    pub slo: Duration,
    /// Most distinct `queue` label values in metrics; further queues share
    /// the label value `(other)` (queue names come from clients).
    #[arg(long, env = "RUNLEASE_METRICS_MAX_QUEUES", default_value_t = crate::metrics::DEFAULT_METRICS_MAX_QUEUES,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=100_000))]
    pub metrics_max_queues: usize,
    /// Log as JSON lines instead of text.
    #[arg(long, env = "RUNLEASE_LOG_JSON", default_value_t = false)]
    pub log_json: bool,
}

/// Lease-token secrets and API keys, each also readable from a file.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Secrets and API keys")]
pub struct KeySettings {
    /// Key for lease-token MACs; share it between replicas. Generated when absent.
    #[arg(long, env = "RUNLEASE_SECRET")]
    pub secret: Option<String>,
    /// A file holding `RUNLEASE_SECRET` (a container secret), instead of the value.
    #[arg(long, env = "RUNLEASE_SECRET_FILE")]
    pub secret_file: Option<std::path::PathBuf>,
    /// API keys: comma-separated `role:key[:queue|queue...]`, role one of producer, worker, admin.
    #[arg(long, env = "RUNLEASE_API_KEYS")]
    pub api_keys: Option<String>,
    /// A file holding `RUNLEASE_API_KEYS`.
    #[arg(long, env = "RUNLEASE_API_KEYS_FILE")]
    pub api_keys_file: Option<std::path::PathBuf>,
    /// Lease tokens to mint: 2 (they name their job's queue, so a key
    /// limited to other queues cannot use them), or 1 while replicas older
    /// than v1.2 still serve, which verify only those (set 2 once every
    /// replica runs this version).
    #[arg(long, env = "RUNLEASE_LEASE_TOKEN_VERSION", default_value_t = 2,
          value_parser = clap::value_parser!(u8).range(1..=2))]
    pub lease_token_version: u8,
}

/// PostgreSQL: where, how many connections, how long work may take.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "PostgreSQL")]
pub struct DatabaseSettings {
    /// PostgreSQL URL; the database is created if missing; `sslmode` is honoured.
    #[arg(id = "database_url", long = "database-url", value_name = "DATABASE_URL", env = "RUNLEASE_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
    pub url: String,
    /// A file holding `RUNLEASE_DATABASE_URL` (it carries the password).
    #[arg(
        id = "database_url_file",
        long = "database-url-file",
        value_name = "DATABASE_URL_FILE",
        env = "RUNLEASE_DATABASE_URL_FILE"
    )]
    pub url_file: Option<std::path::PathBuf>,
    /// Most PostgreSQL connections this coordinator holds.
    #[arg(id = "database_pool_size", long = "database-pool-size", value_name = "DATABASE_POOL_SIZE", env = "RUNLEASE_DATABASE_POOL_SIZE", default_value_t = DEFAULT_DATABASE_POOL_SIZE,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub pool_size: usize,
    /// PostgreSQL's `statement_timeout` on the coordinator's connections, ms
    /// (0: none). Long-polls wait in the coordinator, not in PostgreSQL.
    #[arg(id = "database_statement_timeout_ms", long = "database-statement-timeout-ms", value_name = "DATABASE_STATEMENT_TIMEOUT_MS", env = "RUNLEASE_DATABASE_STATEMENT_TIMEOUT_MS", default_value = "5000",
          value_parser = ms(0..=600_000))]
    pub statement_timeout: Duration,
    /// The coordinator's deadline on one database operation (taking a
    /// connection and running its statements), ms. A connection whose
    /// operation overran it is thrown away; the request answers 503.
    #[arg(id = "database_call_timeout_ms", long = "database-call-timeout-ms", value_name = "DATABASE_CALL_TIMEOUT_MS", env = "RUNLEASE_DATABASE_CALL_TIMEOUT_MS", default_value = "6000",
          value_parser = ms(100..=600_000))]
    pub call_timeout: Duration,
}

impl DatabaseSettings {
    /// The deadlines of database work.
    pub fn deadlines(&self) -> crate::store::connect::Deadlines {
        crate::store::connect::Deadlines {
            statement: self.statement_timeout,
            call: self.call_timeout,
        }
    }
}

/// Redis: wake-ups between coordinators, and the repair of those that
/// could not be sent.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Redis")]
pub struct RedisSettings {
    /// Redis URL for wake-up signals between coordinators; empty disables
    /// Redis (one coordinator, local wake-ups only).
    #[arg(id = "redis_url", long = "redis-url", value_name = "REDIS_URL", env = "RUNLEASE_REDIS_URL", default_value = DEFAULT_REDIS_URL)]
    pub url: String,
    /// A file holding `RUNLEASE_REDIS_URL`.
    #[arg(
        id = "redis_url_file",
        long = "redis-url-file",
        value_name = "REDIS_URL_FILE",
        env = "RUNLEASE_REDIS_URL_FILE"
    )]
    pub url_file: Option<std::path::PathBuf>,
    /// Prefix of the Redis channel names (`<prefix>:wake`, `<prefix>:terminal`).
    #[arg(id = "redis_prefix", long = "redis-prefix", value_name = "REDIS_PREFIX", env = "RUNLEASE_REDIS_PREFIX", default_value = DEFAULT_REDIS_PREFIX)]
    pub prefix: String,
    /// How often `enqueue_failed` jobs get their wake-up re-sent, ms.
    #[arg(id = "repair_interval_ms", long = "repair-interval-ms", value_name = "REPAIR_INTERVAL_MS", env = "RUNLEASE_REPAIR_INTERVAL_MS", default_value = "1000", value_parser = ms(10..=3_600_000))]
    pub repair_interval: Duration,
}

/// Leases, attempts, the reaper and long-polls.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Leases and long-polls")]
pub struct LeaseConfig {
    /// Lease time to live, ms.
    #[arg(id = "lease_ttl_ms", long = "lease-ttl-ms", value_name = "LEASE_TTL_MS", env = "RUNLEASE_LEASE_TTL_MS", default_value = "15000", value_parser = ms(100..=3_600_000))]
    pub ttl: Duration,
    /// Heartbeat interval told to workers, ms.
    #[arg(id = "heartbeat_interval_ms", long = "heartbeat-interval-ms", value_name = "HEARTBEAT_INTERVAL_MS", env = "RUNLEASE_HEARTBEAT_INTERVAL_MS", default_value = "5000",
          value_parser = ms(10..=3_600_000))]
    pub heartbeat_interval: Duration,
    /// How often the reaper looks for expired leases, ms.
    #[arg(id = "reaper_interval_ms", long = "reaper-interval-ms", value_name = "REAPER_INTERVAL_MS", env = "RUNLEASE_REAPER_INTERVAL_MS", default_value = "5000",
          value_parser = ms(10..=3_600_000))]
    pub reaper_interval: Duration,
    /// Attempt budget of a job that does not set `max_attempts`.
    #[arg(long, env = "RUNLEASE_MAX_ATTEMPTS", default_value_t = DEFAULT_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub max_attempts: i32,
    /// Run-time limit of an attempt whose job does not set `timeout_ms`, ms.
    #[arg(id = "default_timeout_ms", long = "default-timeout-ms", value_name = "DEFAULT_TIMEOUT_MS", env = "RUNLEASE_DEFAULT_TIMEOUT_MS", default_value = "300000",
          value_parser = ms(1..=86_400_000))]
    pub default_timeout: Duration,
    /// How often a parked claim or job read re-checks PostgreSQL without a wake-up (and the claim floors are checked at most), ms.
    #[arg(id = "claim_recheck_ms", long = "claim-recheck-ms", value_name = "CLAIM_RECHECK_MS", env = "RUNLEASE_CLAIM_RECHECK_MS", default_value = "1000", value_parser = ms(10..=60_000))]
    pub claim_recheck: Duration,
}

impl LeaseConfig {
    /// Lease terms and the retry policy the store applies.
    pub fn terms(&self) -> crate::store::LeaseSettings {
        crate::store::LeaseSettings {
            ttl: self.ttl,
            heartbeat_interval: self.heartbeat_interval,
            default_timeout: self.default_timeout,
            default_max_attempts: self.max_attempts,
            backoff_base: crate::store::DEFAULT_BACKOFF_BASE,
            backoff_cap: crate::store::DEFAULT_BACKOFF_CAP,
        }
    }
}

/// Gathering concurrent claims, heartbeats, finishes and single-job enqueues
/// into shared statements.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Batching")]
pub struct BatchConfig {
    /// Gather concurrent claims, heartbeats, finishes and single-job
    /// enqueues into shared statements (`false`: each request is written
    /// alone).
    #[arg(id = "batching", long = "batching", value_name = "BATCHING", env = "RUNLEASE_BATCHING", default_value_t = true, action = clap::ArgAction::Set)]
    pub enabled: bool,
    /// Most requests (or claim slots) written by one statement.
    #[arg(id = "batch_max_size", long = "batch-max-size", value_name = "BATCH_MAX_SIZE", env = "RUNLEASE_BATCH_MAX_SIZE", default_value_t = DEFAULT_BATCH_MAX_SIZE,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub max_size: usize,
    /// How long the first request of a finish or heartbeat batch may wait
    /// for company, ms (0: batches form only while an earlier one is being
    /// written; enqueues and claims never wait for company).
    #[arg(id = "batch_max_delay_ms", long = "batch-max-delay-ms", value_name = "BATCH_MAX_DELAY_MS", env = "RUNLEASE_BATCH_MAX_DELAY_MS", default_value = "0", value_parser = ms(0..=1_000))]
    pub max_delay: Duration,
    /// Batches of one kind (claims, finishes, heartbeats, enqueues) written at once,
    /// each on its own connection.
    #[arg(id = "batch_flushers", long = "batch-flushers", value_name = "BATCH_FLUSHERS", env = "RUNLEASE_BATCH_FLUSHERS", default_value_t = DEFAULT_BATCH_FLUSHERS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub flushers: usize,
    /// Requests a batch needs to be written while another flush of its
    /// kind is in flight; a smaller one waits for that flush (gathering
    /// meanwhile). 1: every free flusher writes at once.
    #[arg(id = "batch_parallel_min", long = "batch-parallel-min", value_name = "BATCH_PARALLEL_MIN", env = "RUNLEASE_BATCH_PARALLEL_MIN", default_value_t = DEFAULT_BATCH_PARALLEL_MIN,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=10_000))]
    pub parallel_min: usize,
}

impl BatchConfig {
    /// How the batchers gather requests.
    pub fn settings(&self) -> crate::batch::BatchSettings {
        crate::batch::BatchSettings {
            enabled: self.enabled,
            max_size: self.max_size,
            max_delay: self.max_delay,
            flushers: self.flushers,
            parallel_min: self.parallel_min,
            // Claims batch across parked claimers already: half as many loops.
            claim_shards: (self.flushers / 2).max(1),
        }
    }
}

/// Retention of terminal jobs and the prune pass that enforces it.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Retention")]
pub struct RetentionConfig {
    /// How long done jobs are kept once terminal, ms (0: forever). A queue
    /// setting overrides it.
    #[arg(id = "retention_done_ms", long = "retention-done-ms", value_name = "RETENTION_DONE_MS", env = "RUNLEASE_RETENTION_DONE_MS", default_value = "604800000",
          value_parser = ms(0..=315_360_000_000))]
    pub done: Duration,
    /// How long failed and cancelled jobs are kept once terminal, ms (0: forever).
    #[arg(id = "retention_failed_ms", long = "retention-failed-ms", value_name = "RETENTION_FAILED_MS", env = "RUNLEASE_RETENTION_FAILED_MS", default_value = "2592000000",
          value_parser = ms(0..=315_360_000_000))]
    pub failed: Duration,
    /// How often a prune pass runs, ms.
    #[arg(id = "prune_interval_ms", long = "prune-interval-ms", value_name = "PRUNE_INTERVAL_MS", env = "RUNLEASE_PRUNE_INTERVAL_MS", default_value = "10000", value_parser = ms(10..=86_400_000))]
    pub prune_interval: Duration,
    /// Most jobs one prune statement deletes (each is its own short transaction).
    #[arg(id = "prune_batch", long = "prune-batch", value_name = "PRUNE_BATCH", env = "RUNLEASE_PRUNE_BATCH", default_value_t = DEFAULT_PRUNE_BATCH,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub prune_batch: u32,
}

impl RetentionConfig {
    /// Retention of terminal jobs, as the store counts it (ms; 0: forever).
    pub fn retention(&self) -> crate::prune::Retention {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        crate::prune::Retention {
            done_ms: ms(self.done),
            failed_ms: ms(self.failed),
        }
    }
}

/// SQS wake-ups that start Lambda workers.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "SQS wake-ups for Lambda workers")]
pub struct SqsConfig {
    /// Queues whose workers are Lambda functions woken through SQS:
    /// comma-separated `queue=sqs_queue_url`.
    #[arg(
        id = "sqs_queues",
        long = "sqs-queues",
        value_name = "SQS_QUEUES",
        env = "RUNLEASE_SQS_QUEUES"
    )]
    pub queues: Option<String>,
    /// SQS endpoint override (e.g. moto's or LocalStack's URL); region and
    /// credentials come from the standard AWS_* environment.
    #[arg(
        id = "sqs_endpoint",
        long = "sqs-endpoint",
        value_name = "SQS_ENDPOINT",
        env = "RUNLEASE_SQS_ENDPOINT"
    )]
    pub endpoint: Option<String>,
    /// Jobs one Lambda invocation is expected to take: one wake-up message per
    /// this many due jobs.
    #[arg(id = "sqs_jobs_per_wakeup", long = "sqs-jobs-per-wakeup", value_name = "SQS_JOBS_PER_WAKEUP", env = "RUNLEASE_SQS_JOBS_PER_WAKEUP", default_value_t = DEFAULT_SQS_JOBS_PER_WAKEUP,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=1000))]
    pub jobs_per_wakeup: usize,
    /// How often due jobs of SQS-bound queues are looked for (retries,
    /// delayed jobs, failed sends), ms.
    #[arg(id = "sqs_dispatch_interval_ms", long = "sqs-dispatch-interval-ms", value_name = "SQS_DISPATCH_INTERVAL_MS", env = "RUNLEASE_SQS_DISPATCH_INTERVAL_MS", default_value = "1000",
          value_parser = ms(10..=3_600_000))]
    pub dispatch_interval: Duration,
}

/// HTTP endpoints as workers: where an endpoint may point, how its secret
/// is rotated, how a failing one is backed off.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HTTP endpoints as workers")]
pub struct EndpointConfig {
    /// Hosts an endpoint may reach although they are loopback, private,
    /// link-local or unspecified addresses (or resolve to one), and may
    /// reach over plain http: comma-separated host names or addresses, for
    /// local development and tests.
    #[arg(
        id = "endpoint_allow_hosts",
        long = "endpoint-allow-hosts",
        value_name = "ENDPOINT_ALLOW_HOSTS",
        env = "RUNLEASE_ENDPOINT_ALLOW_HOSTS"
    )]
    pub allow_hosts: Option<String>,
    /// How long the previous endpoint secret keeps signing beside the new
    /// one after a rotation, ms.
    #[arg(id = "endpoint_rotation_ms", long = "endpoint-rotation-ms", value_name = "ENDPOINT_ROTATION_MS", env = "RUNLEASE_ENDPOINT_ROTATION_MS", default_value = "86400000",
          value_parser = ms(0..=2_592_000_000))]
    pub rotation: Duration,
    /// The first pause after an endpoint could not be reached, ms; each
    /// failure in a row doubles it, up to RUNLEASE_ENDPOINT_BACKOFF_MAX_MS.
    #[arg(id = "endpoint_backoff_ms", long = "endpoint-backoff-ms", value_name = "ENDPOINT_BACKOFF_MS", env = "RUNLEASE_ENDPOINT_BACKOFF_MS", default_value = "1000",
          value_parser = ms(10..=60_000))]
    pub backoff: Duration,
    /// The longest pause after an endpoint could not be reached, ms.
    #[arg(id = "endpoint_backoff_max_ms", long = "endpoint-backoff-max-ms", value_name = "ENDPOINT_BACKOFF_MAX_MS", env = "RUNLEASE_ENDPOINT_BACKOFF_MAX_MS", default_value = "60000",
          value_parser = ms(10..=3_600_000))]
    pub backoff_max: Duration,
    /// This coordinator's URL as endpoints reach it, sent in every request
    /// as `coordinator_url` (a function that answers 202 finishes there).
    /// Empty: `http://` and the address it listens on.
    #[arg(
        id = "public_url",
        long = "public-url",
        value_name = "PUBLIC_URL",
        env = "RUNLEASE_PUBLIC_URL"
    )]
    pub public_url: Option<String>,
}

impl EndpointConfig {
    /// Checks `RUNLEASE_PUBLIC_URL` (an http or https URL, or empty).
    pub fn validate(&self) -> Result<(), String> {
        let Some(raw) = self
            .public_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
        else {
            return Ok(());
        };
        match url::Url::parse(raw) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => Ok(()),
            _ => Err(format!(
                "RUNLEASE_PUBLIC_URL is {raw:?}: it must be the http(s) URL endpoints reach this coordinator at, e.g. https://runlease.example.com"
            )),
        }
    }
}
