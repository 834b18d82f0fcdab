//! Every setting of the coordinator, as a flag and an environment variable,
//! grouped by the part of the coordinator that uses it. Names and defaults
//! are a contract operators rely on: docs/configuration.md is generated
//! from `--help` (scripts/config-reference.sh) and CI checks it.

use clap::{Args, Parser, Subcommand};

mod groups;

pub use groups::{
    BatchConfig, DatabaseSettings, EndpointConfig, KeySettings, LeaseConfig, RedisSettings, RetentionConfig,
    ServerSettings, SqsConfig,
};

/// Default `RUNLEASE_DATABASE_URL`.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/runlease";
/// Default `RUNLEASE_REDIS_URL`.
pub const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
/// Default `RUNLEASE_LISTEN`.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default `RUNLEASE_LEASE_TTL_MS`: 15 s.
pub const DEFAULT_LEASE_TTL_MS: u64 = 15_000;
/// Default `RUNLEASE_HEARTBEAT_INTERVAL_MS`: 5 s, a third of the TTL.
pub const DEFAULT_HEARTBEAT_INTERVAL_MS: u64 = 5_000;
/// Default `RUNLEASE_REAPER_INTERVAL_MS`: 5 s.
pub const DEFAULT_REAPER_INTERVAL_MS: u64 = 5_000;
/// Default `RUNLEASE_MAX_ATTEMPTS`: 4, i.e. 3 retries.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 4;
/// Default `RUNLEASE_DEFAULT_TIMEOUT_MS`: 5 min.
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// Default `RUNLEASE_MAX_BODY_BYTES`: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;
/// Default `RUNLEASE_SLO_MS`: 25 s from enqueue to a terminal state.
pub const DEFAULT_SLO_MS: u64 = 25_000;
/// Default `RUNLEASE_DATABASE_POOL_SIZE`.
pub const DEFAULT_DATABASE_POOL_SIZE: usize = 20;
/// Default `RUNLEASE_REDIS_PREFIX`: channel names start with it.
pub const DEFAULT_REDIS_PREFIX: &str = "runlease";
/// Default `RUNLEASE_CLAIM_RECHECK_MS`: how often a parked long-poll re-checks
/// PostgreSQL when no wake-up came.
pub const DEFAULT_CLAIM_RECHECK_MS: u64 = 1_000;
/// Default `RUNLEASE_REPAIR_INTERVAL_MS`: how often `enqueue_failed` jobs are repaired.
pub const DEFAULT_REPAIR_INTERVAL_MS: u64 = 1_000;
/// Default `RUNLEASE_BATCH_MAX_SIZE`: most requests (or claim slots) per statement.
pub const DEFAULT_BATCH_MAX_SIZE: usize = 1000;
/// Default `RUNLEASE_BATCH_MAX_DELAY_MS`: 0, pure group commit (a lone request is not slowed).
pub const DEFAULT_BATCH_MAX_DELAY_MS: u64 = 0;
/// Default `RUNLEASE_BATCH_FLUSHERS`: batches of one kind written at once.
/// Measured on 2 cores with 256 workers, once the statements' cost followed
/// their rows (ADR 011): 1 and 2 drain alike and spend less PostgreSQL CPU
/// per job than 4 (fewer claims skipping each other's locked rows).
pub const DEFAULT_BATCH_FLUSHERS: usize = 2;
/// Default `RUNLEASE_BATCH_PARALLEL_MIN`: requests a batch needs to be
/// written beside a flush of its kind already in flight. Measured on 2
/// cores (16 and 256 HTTP workers, 8 leases each): below it a small batch
/// waits for the flush in flight, which at 16 workers nearly halves the
/// transactions per job and cuts PostgreSQL's CPU per job by a fifth; at
/// 256 the batches pass it at once and the flushes overlap as before
/// (ADR 022 has the figures).
pub const DEFAULT_BATCH_PARALLEL_MIN: usize = 8;
/// Default `RUNLEASE_SQS_JOBS_PER_WAKEUP`: jobs one Lambda invocation is expected to take.
pub const DEFAULT_SQS_JOBS_PER_WAKEUP: usize = 10;
/// Default `RUNLEASE_SQS_DISPATCH_INTERVAL_MS`: how often due jobs are looked for.
pub const DEFAULT_SQS_DISPATCH_INTERVAL_MS: u64 = 1_000;
/// Default `RUNLEASE_DATABASE_STATEMENT_TIMEOUT_MS`: 5 s.
pub const DEFAULT_DATABASE_STATEMENT_TIMEOUT_MS: u64 = 5_000;
/// Default `RUNLEASE_DATABASE_CALL_TIMEOUT_MS`: 6 s (a little longer than the
/// statement timeout, so PostgreSQL's cleaner error usually comes first).
pub const DEFAULT_DATABASE_CALL_TIMEOUT_MS: u64 = 6_000;
/// Default `RUNLEASE_RETENTION_DONE_MS`: 7 days.
pub const DEFAULT_RETENTION_DONE_MS: u64 = 7 * 86_400_000;
/// Default `RUNLEASE_RETENTION_FAILED_MS` (also for cancelled jobs): 30 days.
pub const DEFAULT_RETENTION_FAILED_MS: u64 = 30 * 86_400_000;
/// Default `RUNLEASE_PRUNE_INTERVAL_MS`: 10 s.
pub const DEFAULT_PRUNE_INTERVAL_MS: u64 = 10_000;
/// Default `RUNLEASE_PRUNE_BATCH`: rows per prune statement.
pub const DEFAULT_PRUNE_BATCH: u32 = 1000;
/// Default `RUNLEASE_SHUTDOWN_GRACE_MS`: how long in-flight requests may take after SIGTERM.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 30_000;
/// Fewest bytes in each `RUNLEASE_SECRET` key: HMAC-SHA256 is only as
/// strong as its key, and a short one can be guessed from a single token.
/// The key a coordinator generates when none is set has this many.
pub const MIN_SECRET_BYTES: usize = 32;

/// Command line of `runlease-coordinator`.
#[derive(Debug, Parser)]
#[command(
    name = "runlease-coordinator",
    version,
    about = "The runlease coordinator",
    // `--help` names each setting's variable but never shows its value
    // from the environment: the database and Redis URLs carry passwords.
    // Applied to every argument once all are added, so a setting added
    // later (or flattened in from elsewhere) cannot forget it.
    mut_args = |arg: clap::Arg| arg.hide_env_values(true),
    // Each setting's text on the lines below it, in every section alike
    // (docs/configuration.md is generated from this output).
    next_line_help = true
)]
pub struct Cli {
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings shared by every subcommand.
    #[command(flatten)]
    pub config: Config,
}

/// Subcommands.
#[derive(Debug, Clone, Copy, Subcommand)]
pub enum Command {
    /// Apply migrations, then serve the HTTP protocol (the default).
    Serve,
    /// Apply migrations and exit.
    Migrate,
}

/// The coordinator's settings, grouped by the part of it that uses them;
/// each group is handed whole to that part. Every setting is a flag and a
/// `RUNLEASE_*` variable; durations are given in milliseconds.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// The HTTP server.
    #[command(flatten)]
    pub server: ServerSettings,
    /// Lease-token secrets and API keys.
    #[command(flatten)]
    pub keys: KeySettings,
    /// PostgreSQL.
    #[command(flatten)]
    pub database: DatabaseSettings,
    /// Redis wake-ups and their repair.
    #[command(flatten)]
    pub redis: RedisSettings,
    /// Leases, attempts and long-polls.
    #[command(flatten)]
    pub leases: LeaseConfig,
    /// Gathering requests into shared statements.
    #[command(flatten)]
    pub batching: BatchConfig,
    /// Retention of terminal jobs.
    #[command(flatten)]
    pub retention: RetentionConfig,
    /// SQS wake-ups for Lambda workers.
    #[command(flatten)]
    pub sqs: SqsConfig,
    /// Limits on connections, parked long-polls and answer sizes.
    #[command(flatten)]
    pub limits: crate::limits::LimitSettings,
    /// HTTP endpoints as workers.
    #[command(flatten)]
    pub endpoints: EndpointConfig,
}

impl Config {
    /// The settings from `RUNLEASE_*` environment variables, defaults for the rest.
    pub fn from_env() -> Result<Self, clap::Error> {
        Cli::try_parse_from(["runlease-coordinator"]).map(|cli| cli.config)
    }

    /// Reads the `*_FILE` settings into the values they stand for (the
    /// file's content without its trailing newline). A setting given both
    /// ways is an error, so a forgotten variable cannot silently win.
    pub fn load_secret_files(&mut self) -> Result<(), String> {
        fn read(path: &std::path::Path, name: &str) -> Result<String, String> {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {name}_FILE {}: {e}", path.display()))?;
            Ok(text.trim_end_matches(['\n', '\r']).to_owned())
        }
        fn load(
            value: &mut Option<String>,
            file: &mut Option<std::path::PathBuf>,
            name: &str,
        ) -> Result<(), String> {
            if let Some(path) = file.take() {
                if value.as_deref().is_some_and(|v| !v.is_empty()) {
                    return Err(format!("set {name} or {name}_FILE, not both"));
                }
                *value = Some(read(&path, name)?);
            }
            Ok(())
        }
        fn load_over_default(
            value: &mut String,
            default: &str,
            file: &mut Option<std::path::PathBuf>,
            name: &str,
        ) -> Result<(), String> {
            let mut given = (value != default).then(|| value.clone());
            load(&mut given, file, name)?;
            if let Some(v) = given {
                *value = v;
            }
            Ok(())
        }
        load(
            &mut self.keys.secret,
            &mut self.keys.secret_file,
            "RUNLEASE_SECRET",
        )?;
        load(
            &mut self.keys.api_keys,
            &mut self.keys.api_keys_file,
            "RUNLEASE_API_KEYS",
        )?;
        load_over_default(
            &mut self.database.url,
            DEFAULT_DATABASE_URL,
            &mut self.database.url_file,
            "RUNLEASE_DATABASE_URL",
        )?;
        load_over_default(
            &mut self.redis.url,
            DEFAULT_REDIS_URL,
            &mut self.redis.url_file,
            "RUNLEASE_REDIS_URL",
        )?;
        Ok(())
    }

    /// The lease-token secrets: `RUNLEASE_SECRET` may list several,
    /// comma-separated; the first signs new tokens, every one verifies.
    /// [`Config::validate`] refuses a key shorter than [`MIN_SECRET_BYTES`].
    pub fn secrets(&self) -> Vec<Vec<u8>> {
        self.secret_keys().map(|s| s.as_bytes().to_vec()).collect()
    }

    /// The keys of `RUNLEASE_SECRET`, split at commas, trimmed, empty ones dropped.
    fn secret_keys(&self) -> impl Iterator<Item = &str> {
        self.keys
            .secret
            .as_deref()
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
    }

    /// Refuses a `RUNLEASE_SECRET` key shorter than [`MIN_SECRET_BYTES`],
    /// and a value that holds only commas and blanks (it would otherwise
    /// read as unset and get a generated key). The message never quotes a
    /// key.
    fn validate_secret(&self) -> Result<(), String> {
        const MAKE_ONE: &str = "make one with `openssl rand -base64 32`";
        let keys: Vec<&str> = self.secret_keys().collect();
        if keys.is_empty() {
            if self.keys.secret.as_deref().is_some_and(|s| !s.trim().is_empty()) {
                return Err(format!(
                    "RUNLEASE_SECRET holds no key: it is split at commas into keys, and every part is empty; set at least one key of {MIN_SECRET_BYTES} bytes or more ({MAKE_ONE}), or unset it to have one generated"
                ));
            }
            return Ok(());
        }
        let Some((n, short)) = keys.iter().enumerate().find(|(_, k)| k.len() < MIN_SECRET_BYTES) else {
            return Ok(());
        };
        if keys.len() == 1 {
            Err(format!(
                "RUNLEASE_SECRET is {} bytes; a lease-token key must be at least {MIN_SECRET_BYTES} bytes ({MAKE_ONE})",
                short.len()
            ))
        } else {
            Err(format!(
                "RUNLEASE_SECRET key {} of {} is {} bytes; every lease-token key must be at least {MIN_SECRET_BYTES} bytes ({MAKE_ONE}). RUNLEASE_SECRET is split at commas into keys (the first signs, every one verifies), so a secret with a comma in it is read as several shorter keys",
                n + 1,
                keys.len(),
                short.len()
            ))
        }
    }

    /// Checks that settings agree with each other, and that every
    /// `RUNLEASE_SECRET` key is at least [`MIN_SECRET_BYTES`] long.
    pub fn validate(&self) -> Result<(), String> {
        self.validate_secret()?;
        if self.leases.heartbeat_interval >= self.leases.ttl {
            return Err(format!(
                "RUNLEASE_HEARTBEAT_INTERVAL_MS ({}) must be below RUNLEASE_LEASE_TTL_MS ({}); a third of it is usual",
                self.leases.heartbeat_interval.as_millis(),
                self.leases.ttl.as_millis()
            ));
        }
        if self.server.max_body_bytes < 1024 {
            return Err("RUNLEASE_MAX_BODY_BYTES must be at least 1024".into());
        }
        let bindings = crate::dispatch::parse_bindings(self.sqs.queues.as_deref().unwrap_or_default())?;
        if !crate::dispatch::SQS_BUILT_IN && !bindings.is_empty() {
            // Ignoring them would leave those queues' Lambda workers never woken.
            let mut queues: Vec<&str> = bindings.keys().map(|q| q.as_str()).collect();
            queues.sort_unstable();
            return Err(format!(
                "RUNLEASE_SQS_QUEUES binds {}, but this coordinator was built without SQS dispatch (cargo feature `sqs`); unset RUNLEASE_SQS_QUEUES or run a build with default features",
                queues.join(", ")
            ));
        }
        self.endpoints.validate()
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn with_secret(secret: &str) -> Config {
        let mut config = Cli::try_parse_from(["runlease-coordinator"]).unwrap().config;
        config.keys.secret = Some(secret.to_owned());
        config
    }

    #[test]
    fn every_secret_key_must_be_32_bytes() {
        let long = "k".repeat(MIN_SECRET_BYTES);
        assert_eq!(with_secret(&long).validate(), Ok(()));
        assert_eq!(with_secret(&format!(" {long} , {long}x ,")).validate(), Ok(()));
        let err = with_secret(&"k".repeat(MIN_SECRET_BYTES - 1))
            .validate()
            .unwrap_err();
        assert!(
            err.contains("31 bytes") && err.contains("at least 32 bytes"),
            "{err}"
        );
        assert!(!err.contains(&"k".repeat(8)), "the message quotes the key: {err}");
        let err = with_secret(&format!("{long},tail!")).validate().unwrap_err();
        assert!(
            err.contains("key 2 of 2 is 5 bytes") && err.contains("split at commas"),
            "{err}"
        );
        assert!(!err.contains("tail!"), "the message quotes the key: {err}");
        assert!(
            with_secret(" , ")
                .validate()
                .unwrap_err()
                .contains("holds no key")
        );
        // Unset (or blank) still means a generated key.
        assert_eq!(with_secret(" ").validate(), Ok(()));
    }

    #[test]
    fn the_public_url_is_an_http_url_or_empty() {
        let long = "k".repeat(MIN_SECRET_BYTES);
        let with_url = |url: &str| {
            let mut config = with_secret(&long);
            config.endpoints.public_url = Some(url.to_owned());
            config.validate()
        };
        assert_eq!(with_url("https://runlease.example.com"), Ok(()));
        assert_eq!(with_url("http://10.0.0.5:8080/"), Ok(()));
        assert_eq!(with_url(" "), Ok(()));
        for bad in ["runlease.example.com", "ftp://x/", "https://"] {
            assert!(
                with_url(bad).unwrap_err().contains("RUNLEASE_PUBLIC_URL"),
                "{bad}"
            );
        }
    }

    #[test]
    fn help_shows_no_value_from_the_environment() {
        let cli = Cli::command();
        for arg in cli.get_arguments().filter(|a| a.get_env().is_some()) {
            assert!(arg.is_hide_env_values_set(), "--{} shows its value", arg.get_id());
        }
    }
}
