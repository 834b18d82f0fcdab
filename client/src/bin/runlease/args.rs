//! The command line: verbs, flags and the parsers of their values.
//!
//! Units are the protocol's: every duration is a whole number of
//! milliseconds in a flag named `--*-ms` (`--delay-ms`, `--timeout-ms`,
//! `--wait-ms`, `--done-ms`), every instant an RFC 3339 timestamp.

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use runlease_client::protocol::JobState;
use runlease_client::protocol::admin::RateLimit;
use runlease_client::protocol::limits::{
    MAX_ENDPOINT_CONCURRENCY, MAX_ENDPOINT_TIMEOUT_MS, MAX_RATE, MAX_RUNNING_LIMIT, MIN_ENDPOINT_TIMEOUT_MS,
};
use runlease_client::protocol::{Backoff, QueueName, retry};

#[derive(Debug, Parser)]
#[command(name = "runlease", version, about = "Talk to a runlease coordinator")]
pub struct Cli {
    /// The coordinator's URL.
    // Its value is hidden from `--help` like the key's: a URL may carry
    // a password (`https://user:password@host`).
    #[arg(
        long,
        env = "RUNLEASE_URL",
        hide_env_values = true,
        default_value = "http://127.0.0.1:8080",
        global = true,
        help_heading = "Global options"
    )]
    pub url: String,
    /// API key (Authorization: Bearer).
    #[arg(
        long,
        env = "RUNLEASE_KEY",
        hide_env_values = true,
        global = true,
        help_heading = "Global options"
    )]
    pub key: Option<String>,
    /// Print exactly what the coordinator answered, as JSON on stdout, and
    /// errors as {"error": {"code", "message"}} on stderr.
    #[arg(long, global = true, help_heading = "Global options")]
    pub json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Enqueue a job; the JSON payload is read from standard input when omitted.
    Enqueue {
        /// Queue name.
        queue: String,
        /// JSON payload.
        payload: Option<String>,
        /// Smaller runs first.
        #[arg(long)]
        priority: Option<i32>,
        /// Not before this instant (RFC 3339).
        #[arg(long, conflicts_with = "delay_ms")]
        run_at: Option<DateTime<Utc>>,
        /// Not before this many ms from now.
        #[arg(long)]
        delay_ms: Option<i64>,
        /// Attempt budget.
        #[arg(long)]
        max_attempts: Option<i32>,
        /// Run-time limit of one attempt, ms.
        #[arg(long)]
        timeout_ms: Option<i64>,
        /// A repeat with the same key on the same queue answers the original job.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Jobs sharing a key count against the queue's max_running_per_key.
        #[arg(long, value_name = "KEY")]
        concurrency_key: Option<String>,
        /// Wait (blocked) until this job has ended; repeat for several (at most 100).
        #[arg(long, value_name = "JOB_ID")]
        depends_on: Vec<String>,
        /// What a dependency that fails, is cancelled or deleted does: cancel this job, or run it anyway.
        #[arg(long, value_name = "cancel|run", requires = "depends_on")]
        on_dependency_failure: Option<DependencyFailure>,
    },
    /// Show a job.
    Get {
        /// Job id.
        id: String,
    },
    /// Wait until a job is terminal, showing its state and progress.
    Wait {
        /// Job id.
        id: String,
        /// Give up after this many ms (exit 124).
        #[arg(long, value_name = "MS", default_value_t = DEFAULT_WAIT_MS)]
        wait_ms: u64,
        /// The former spelling of --wait-ms, in seconds.
        #[arg(long, hide = true, conflicts_with = "wait_ms")]
        timeout_secs: Option<u64>,
    },
    /// Cancel a job.
    Cancel {
        /// Job id.
        id: String,
    },
    /// Put a failed or cancelled job back on its queue (admin key).
    Retry {
        /// Job id.
        id: String,
    },
    /// Show per-queue figures, or show, pause, resume, limit, set the
    /// retention or the endpoint of one queue.
    ///
    /// With no sub-verb, `runlease queues` lists every queue, as `queues list`.
    #[command(
        after_help = "Examples:\n  runlease queues\n  runlease queues show emails\n  runlease queues pause emails\n  runlease queues resume emails\n  runlease queues limit emails --max-running 10 --rate 5/20\n  runlease queues limit emails --max-running none\n  runlease queues retention emails --done-ms 86400000 --failed-ms default\n  runlease queues set-endpoint emails https://mail.example.com/runlease --timeout-ms 30000\n  runlease queues endpoint-secret emails\n  runlease queues remove-endpoint emails"
    )]
    Queues {
        #[command(subcommand)]
        command: Option<QueuesCommand>,
    },
    /// List a queue's jobs, or retry, cancel or delete the jobs a filter matches.
    ///
    /// A bulk action (retry, cancel, delete) needs --queue and --state, and
    /// may narrow them with --id and --created-before. Without --yes it only
    /// says how many jobs match, changes nothing and exits 1.
    #[command(
        after_help = "Examples:\n  runlease jobs list --queue emails --state failed\n  runlease jobs list --queue emails --state failed,cancelled --all\n  runlease jobs retry --queue emails --state failed            (says how many match)\n  runlease jobs retry --queue emails --state failed --yes      (retries them)\n  runlease jobs delete --queue emails --state done --created-before 2024-06-01T00:00:00Z --yes"
    )]
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// List, set, show or delete cron schedules.
    ///
    /// A schedule enqueues one job on its queue at each fire time of its
    /// cron expression, read in its time zone. With no sub-verb, `runlease
    /// schedules` lists them, as `schedules list`.
    #[command(
        after_help = "Examples:\n  runlease schedules\n  runlease schedules set nightly-report --queue reports --cron '0 3 * * *' --timezone Europe/Paris --payload '{\"kind\": \"daily\"}'\n  echo '{\"ping\": true}' | runlease schedules set heartbeat --queue pings --cron '*/5 * * * *'\n  runlease schedules show nightly-report\n  runlease schedules delete nightly-report"
    )]
    Schedules {
        #[command(subcommand)]
        command: Option<SchedulesCommand>,
    },
    /// Print a completion script for a shell: bash, zsh, fish, elvish or powershell.
    ///
    /// It completes verbs, sub-verbs and flags. Load it in the shell's
    /// start-up file, or install it where the shell looks for completions.
    #[command(
        after_help = "Examples:\n  source <(runlease completions bash)                                  (in ~/.bashrc)\n  runlease completions bash > ~/.local/share/bash-completion/completions/runlease\n  runlease completions zsh > ~/.zfunc/_runlease                       (with fpath+=~/.zfunc before compinit)\n  runlease completions fish > ~/.config/fish/completions/runlease.fish"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// How long `runlease wait` waits by default, in ms (5 minutes).
pub const DEFAULT_WAIT_MS: u64 = 300_000;

#[derive(Debug, Subcommand)]
pub enum SchedulesCommand {
    /// List every schedule: name, queue, cron, time zone, paused, next and last fire.
    List,
    /// Create or replace a schedule (admin key).
    ///
    /// The JSON payload of its jobs is --payload, or standard input when
    /// omitted. A replace sets the whole schedule: an option left out takes
    /// its default (so a paused schedule set again without --paused runs).
    /// Its next fire time is the first after now.
    Set(ScheduleArgs),
    /// Show one schedule.
    Show {
        /// Schedule name.
        name: String,
    },
    /// Delete a schedule (admin key); the jobs it already enqueued stay.
    Delete {
        /// Schedule name.
        name: String,
    },
}

/// The definition of a schedule.
#[derive(Debug, Args)]
pub struct ScheduleArgs {
    /// Schedule name (1 to 128 bytes).
    pub name: String,
    /// The queue its jobs go to.
    #[arg(long)]
    pub queue: String,
    /// `minute hour day month weekday`, or six fields with seconds first
    /// (quote it).
    #[arg(long, value_name = "EXPR")]
    pub cron: String,
    /// IANA time zone the expression is read in (default UTC).
    #[arg(long, value_name = "TZ")]
    pub timezone: Option<String>,
    /// JSON payload of every job it enqueues (default: read standard input).
    #[arg(long, value_name = "JSON")]
    pub payload: Option<String>,
    /// Priority of its jobs; smaller runs first (default 0).
    #[arg(long)]
    pub priority: Option<i32>,
    /// Attempt budget of its jobs (default: the coordinator's).
    #[arg(long)]
    pub max_attempts: Option<i32>,
    /// Run-time limit of one attempt of its jobs, ms.
    #[arg(long)]
    pub timeout_ms: Option<i64>,
    /// Create it paused: it enqueues nothing until set again without --paused.
    #[arg(long)]
    pub paused: bool,
}

#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// Show per-queue figures (the same as `runlease queues`).
    List,
    /// Show one queue's figures and settings.
    ///
    /// Jobs per state, the oldest queued job's age, lease expiries, retries,
    /// and its settings: paused, max_running, max_running_per_key,
    /// rate_limit, retention ("default": the coordinator's setting), the
    /// retry policy (max_attempts, backoff, retry_window) and the
    /// dead_letter_queue;
    /// for a queue served by an endpoint, its URL, time-out, concurrency,
    /// health, requests in flight and last error.
    Show {
        /// Queue name.
        queue: String,
    },
    /// Pause a queue: no claims get its jobs until it is resumed (admin key).
    ///
    /// It still takes enqueues; running jobs keep running. Every replica
    /// sees the pause at once.
    Pause {
        /// Queue name.
        queue: String,
    },
    /// Resume a paused queue: claims get its jobs again (admin key).
    ///
    /// Claims parked on the queue are woken.
    Resume {
        /// Queue name.
        queue: String,
    },
    /// Set or clear a queue's flow-control limits (admin key).
    ///
    /// Each flag takes a value, or `none` to remove that limit; limits not
    /// named stay as they are. Prints the queue's limits after the change.
    #[command(
        after_help = "Examples:\n  runlease queues limit emails --max-running 10\n  runlease queues limit emails --max-running-per-key 1 --rate 2.5/5\n  runlease queues limit emails --max-running none --rate none"
    )]
    Limit {
        /// Queue name.
        queue: String,
        /// Most jobs of the queue running at once (1 to 1,000,000), or none.
        #[arg(long, value_name = "N|none", value_parser = parse_running_limit)]
        max_running: Option<OrNone<i32>>,
        /// Most running jobs sharing one concurrency key (1 to 1,000,000), or none.
        #[arg(long, value_name = "N|none", value_parser = parse_running_limit)]
        max_running_per_key: Option<OrNone<i32>>,
        /// Starts per second on average and most starts at once, e.g. 5/20
        /// or 0.5/1, or none.
        #[arg(long, value_name = "PER_S/BURST|none", value_parser = parse_rate)]
        rate: Option<OrNone<RateLimit>>,
    },
    /// Set how long a queue's finished jobs are kept (admin key).
    ///
    /// Each flag takes a number of ms (0: forever), or `default` to follow
    /// the coordinator's setting again; a flag not given stays as it is.
    /// Jobs are deleted, with their attempts, once they have been terminal
    /// that long. Prints the queue's retention after the change.
    #[command(
        after_help = "Examples:\n  runlease queues retention emails --done-ms 86400000          (done jobs: one day)\n  runlease queues retention emails --failed-ms 0               (failed and cancelled: forever)\n  runlease queues retention emails --done-ms default --failed-ms default"
    )]
    Retention {
        /// Queue name.
        queue: String,
        /// How long done jobs are kept, ms (0: forever), or default.
        #[arg(long, value_name = "MS|default", value_parser = parse_retention, allow_negative_numbers = true)]
        done_ms: Option<OrDefault<i64>>,
        /// How long failed and cancelled jobs are kept, ms (0: forever), or default.
        #[arg(long, value_name = "MS|default", value_parser = parse_retention, allow_negative_numbers = true)]
        failed_ms: Option<OrDefault<i64>>,
    },
    /// Set a queue's retry policy and dead-letter queue (admin key).
    ///
    /// The policy (attempt budget, backoff, retry window) is copied into
    /// each job enqueued later that does not set its own; jobs already
    /// enqueued keep theirs. A job of the queue that fails for good leaves
    /// one follow-up job on the dead-letter queue, with payload {job_id,
    /// queue, payload, error, attempts}. A flag not given stays as it is.
    #[command(
        after_help = "Examples:\n  runlease queues retry emails --max-attempts 10 --backoff base_ms=500,max_ms=60000,factor=2,jitter=1\n  runlease queues retry emails --retry-window-ms 3600000 --dead-letter-queue emails-dead\n  runlease queues retry emails --backoff default --dead-letter-queue none"
    )]
    Retry {
        /// Queue name.
        queue: String,
        /// Attempt budget (1 to 1000), or default (the coordinator's).
        #[arg(long, value_name = "N|default", value_parser = parse_attempts)]
        max_attempts: Option<OrDefault<i32>>,
        /// The backoff as base_ms=,max_ms=,factor=,jitter= (any of them; the
        /// others take the coordinator's defaults), or default.
        #[arg(long, value_name = "FIELD=VALUE,...|default", value_parser = parse_backoff)]
        backoff: Option<OrDefault<Backoff>>,
        /// No retry starts later than this many ms after the first attempt
        /// started, or default (no window).
        #[arg(long, value_name = "MS|default", value_parser = parse_window)]
        retry_window_ms: Option<OrDefault<i64>>,
        /// Where jobs that fail for good leave a follow-up, or none.
        #[arg(long, value_name = "QUEUE|none", value_parser = parse_dead_letter)]
        dead_letter_queue: Option<OrNone<QueueName>>,
    },
    /// Serve a queue by an HTTP endpoint (admin key): the coordinators push
    /// each of its jobs to URL as a signed request.
    ///
    /// The URL must be https, to a public address (a host the coordinator's
    /// RUNLEASE_ENDPOINT_ALLOW_HOSTS lists may be plain http or local). The
    /// first endpoint of a queue makes its signing secret: read it with
    /// `runlease queues endpoint-secret`. Setting it again replaces the
    /// whole endpoint: a flag left out takes its default. Pull claims on the
    /// queue keep working.
    #[command(
        after_help = "Examples:\n  runlease queues set-endpoint reports https://reports.example.workers.dev\n  runlease queues set-endpoint reports https://example.com/runlease --timeout-ms 300000 --concurrency 50\n  runlease queues endpoint-secret reports          (the secret, for the endpoint's settings)"
    )]
    SetEndpoint {
        /// Queue name.
        queue: String,
        /// Where the jobs are pushed (https://...).
        // Not named `url`: that id is the global flag naming the coordinator.
        #[arg(value_name = "URL")]
        endpoint: String,
        /// How long a request may stay open, ms: 1000 to 900000 (default 60000).
        #[arg(long, value_name = "MS", value_parser = clap::value_parser!(i64).range(MIN_ENDPOINT_TIMEOUT_MS..=MAX_ENDPOINT_TIMEOUT_MS))]
        timeout_ms: Option<i64>,
        /// Most requests open at once across every coordinator: 1 to 1000
        /// (default 10); max_running, when lower, holds too.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..=MAX_ENDPOINT_CONCURRENCY))]
        concurrency: Option<i64>,
    },
    /// Stop pushing a queue's jobs to its endpoint (admin key).
    ///
    /// The coordinators send it no new request; its jobs wait for a pull
    /// claim or a new endpoint. The signing secret is kept, so setting an
    /// endpoint again needs no new secret at the endpoint.
    RemoveEndpoint {
        /// Queue name.
        queue: String,
    },
    /// Print the signing secret of a queue's endpoint (admin key).
    ///
    /// Standard output holds the secret alone (whsec_...), to pipe into the
    /// endpoint's settings; during a rotation, standard error also tells
    /// until when the previous one signs. --json prints both.
    #[command(
        after_help = "Examples:\n  runlease queues endpoint-secret reports\n  runlease queues endpoint-secret reports | npx wrangler secret put RUNLEASE_ENDPOINT_SECRET"
    )]
    EndpointSecret {
        /// Queue name.
        queue: String,
    },
    /// Make a new signing secret for a queue's endpoint (admin key).
    ///
    /// Both secrets sign every request for the coordinator's rotation window
    /// (RUNLEASE_ENDPOINT_ROTATION_MS, default 24 h): give the endpoint the
    /// new one (printed on standard output) before the window ends. Sent
    /// once, never retried: each call rotates again.
    RotateEndpointSecret {
        /// Queue name.
        queue: String,
    },
}

/// A setting's new value, or `default` (`OrDefault(None)`) to follow the
/// coordinator's setting again.
#[derive(Debug, Clone, Copy)]
pub struct OrDefault<T>(pub Option<T>);

fn parse_retention(s: &str) -> Result<OrDefault<i64>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("default") {
        return Ok(OrDefault(None));
    }
    match s.parse::<i64>() {
        Ok(ms) if ms >= 0 => Ok(OrDefault(Some(ms))),
        _ => Err(format!(
            "{s:?} is not a retention; use a number of ms (0: forever), or default"
        )),
    }
}

/// A limit's new value, or `none` (`OrNone(None)`) to clear it.
#[derive(Debug, Clone, Copy)]
pub struct OrNone<T>(pub Option<T>);

fn parse_attempts(s: &str) -> Result<OrDefault<i32>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("default") {
        return Ok(OrDefault(None));
    }
    let n: i32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of attempts, or default"))?;
    retry::check_max_attempts(n)?;
    Ok(OrDefault(Some(n)))
}

fn parse_backoff(s: &str) -> Result<OrDefault<Backoff>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("default") {
        return Ok(OrDefault(None));
    }
    let mut backoff = Backoff::default();
    for part in s.split(',') {
        let bad =
            || format!("{part:?}: use base_ms=MS, max_ms=MS, factor=F or jitter=J, separated by commas");
        let (key, value) = part.split_once('=').ok_or_else(bad)?;
        let value = value.trim();
        match key.trim() {
            "base_ms" => backoff.base_ms = Some(value.parse().map_err(|_| bad())?),
            "max_ms" => backoff.max_ms = Some(value.parse().map_err(|_| bad())?),
            "factor" => backoff.factor = Some(value.parse().map_err(|_| bad())?),
            "jitter" => backoff.jitter = Some(value.parse().map_err(|_| bad())?),
            _ => return Err(bad()),
        }
    }
    backoff.check()?;
    Ok(OrDefault(Some(backoff)))
}

fn parse_window(s: &str) -> Result<OrDefault<i64>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("default") {
        return Ok(OrDefault(None));
    }
    let ms: i64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of ms, or default"))?;
    retry::check_retry_window(ms)?;
    Ok(OrDefault(Some(ms)))
}

fn parse_dead_letter(s: &str) -> Result<OrNone<QueueName>, String> {
    if s.trim().eq_ignore_ascii_case("none") {
        return Ok(OrNone(None));
    }
    QueueName::new(s.trim().to_owned())
        .map(|q| OrNone(Some(q)))
        .map_err(|e| format!("{s:?} is not a queue name: {e}"))
}

fn parse_running_limit(s: &str) -> Result<OrNone<i32>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("none") {
        return Ok(OrNone(None));
    }
    match s.parse::<i32>() {
        Ok(n) if (1..=MAX_RUNNING_LIMIT).contains(&n) => Ok(OrNone(Some(n))),
        _ => Err(format!(
            "{s:?} is not a limit; use a number from 1 to {MAX_RUNNING_LIMIT}, or none"
        )),
    }
}

fn parse_rate(s: &str) -> Result<OrNone<RateLimit>, String> {
    let s = s.trim();
    if s.eq_ignore_ascii_case("none") {
        return Ok(OrNone(None));
    }
    let bad = || {
        format!(
            "{s:?} is not a rate; use PER_S/BURST (starts per second above 0, burst from 1; both at most {MAX_RATE}), e.g. 5/20, or none"
        )
    };
    let (per_s, burst) = s.split_once('/').ok_or_else(bad)?;
    let per_s: f64 = per_s.trim().parse().map_err(|_| bad())?;
    let burst: i32 = burst.trim().parse().map_err(|_| bad())?;
    let per_s_ok = per_s.is_finite() && per_s > 0.0 && per_s <= f64::from(MAX_RATE);
    if !per_s_ok || !(1..=MAX_RATE).contains(&burst) {
        return Err(bad());
    }
    Ok(OrNone(Some(RateLimit { per_s, burst })))
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// List a queue's jobs, newest first.
    ///
    /// A table of id, state, attempt/max, created, finished, and the start
    /// of the error. One page at a time (the command for the next page, with
    /// its cursor, is printed on stderr), or every page with --all.
    List {
        /// Queue name.
        #[arg(long)]
        queue: String,
        /// Only jobs in these states, comma-separated or repeated (default:
        /// every state): blocked, queued, enqueue_failed, running, done, failed, cancelled.
        #[arg(long, value_delimiter = ',', value_parser = parse_state)]
        state: Vec<JobState>,
        /// Jobs per page, 1 to 500 (default 50; 500 with --all).
        #[arg(long)]
        limit: Option<u32>,
        /// Start after this cursor: the one a previous page printed, with the
        /// same --queue and --state.
        #[arg(long)]
        cursor: Option<String>,
        /// Follow the pages to the last one (with --json: one answer holding
        /// every job, `next_cursor` null).
        #[arg(long)]
        all: bool,
    },
    /// Put the matching failed and cancelled jobs back on the queue (admin key).
    ///
    /// Each gets a fresh attempt budget. Jobs in other states match but do
    /// not change.
    Retry(BulkArgs),
    /// Cancel the matching queued and running jobs (admin key).
    ///
    /// Queued and enqueue_failed jobs are cancelled at once; running ones are
    /// asked to stop at their worker's next heartbeat. Terminal jobs match
    /// but do not change.
    Cancel(BulkArgs),
    /// Delete the matching done, failed and cancelled jobs (admin key).
    ///
    /// Their attempts go with them. Jobs in other states match but are never
    /// deleted.
    Delete(BulkArgs),
}

/// The filter and the confirmation of a bulk action.
#[derive(Debug, Args)]
#[command(
    after_help = "Without --yes nothing changes: it says how many jobs match now and exits 1.\nWith --yes it prints `matched N, changed M` (--json: the coordinator's answer)."
)]
pub struct BulkArgs {
    /// Queue name.
    #[arg(long)]
    pub queue: String,
    /// The states to match, comma-separated or repeated (at least one):
    /// blocked, queued, enqueue_failed, running, done, failed, cancelled.
    #[arg(long, required = true, value_delimiter = ',', value_parser = parse_state)]
    pub state: Vec<JobState>,
    /// Only this job; repeat for several (at most 10,000).
    #[arg(long = "id", value_name = "ID", value_delimiter = ',')]
    pub ids: Vec<String>,
    /// Only jobs created before this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    pub created_before: Option<DateTime<Utc>>,
    /// Do it. Without --yes: only count the matching jobs, change nothing, exit 1.
    #[arg(long)]
    pub yes: bool,
}

pub fn parse_state(s: &str) -> Result<JobState, String> {
    s.trim().parse().map_err(|_| {
        let names: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        format!("{s:?} is not a job state; use {}", names.join(", "))
    })
}

/// `--on-dependency-failure`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DependencyFailure {
    /// The job is cancelled, its error naming the dependency.
    Cancel,
    /// The job runs anyway.
    Run,
}
