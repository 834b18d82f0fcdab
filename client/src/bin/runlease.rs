//! `runlease`: enqueue, inspect, wait for, cancel and retry jobs from a shell;
//! list a queue's jobs and act on many at once (`jobs`); show, pause, resume
//! and limit a queue (`queues`); list, set, show and delete cron schedules
//! (`schedules`).
//! Exit status: 0 on success; 1 on any error (one line on stderr), and for a
//! bulk action run without `--yes`; for `wait`, 2 when the job ended failed or
//! cancelled and 124 when the wait timed out.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand};
use runlease_client::protocol::admin::{
    BulkActionName, BulkJobsRequest, ListJobsResponse, ListedJob, RateLimit, UpdateQueueRequest,
};
use runlease_client::protocol::limits::{MAX_LIST_LIMIT, MAX_RATE, MAX_RUNNING_LIMIT};
use runlease_client::protocol::producer::{EnqueueJobRequest, QueueSummary};
use runlease_client::protocol::schedules::{ListSchedulesResponse, PutScheduleRequest, Schedule};
use runlease_client::protocol::{Job, JobId, JobState, QueueName};
use runlease_client::{Client, Error, RetryPolicy};

#[derive(Debug, Parser)]
#[command(name = "runlease", version, about = "Talk to a runlease coordinator")]
struct Cli {
    /// The coordinator's URL.
    #[arg(
        long,
        env = "RUNLEASE_URL",
        default_value = "http://127.0.0.1:8080",
        global = true,
        help_heading = "Global options"
    )]
    url: String,
    /// API key (Authorization: Bearer).
    #[arg(
        long,
        env = "RUNLEASE_KEY",
        hide_env_values = true,
        global = true,
        help_heading = "Global options"
    )]
    key: Option<String>,
    /// Print exactly what the coordinator answered, as JSON.
    #[arg(long, global = true, help_heading = "Global options")]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
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
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
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
    /// Show per-queue figures, or show, pause, resume or limit one queue.
    ///
    /// With no sub-verb, `runlease queues` lists every queue, as `queues list`.
    #[command(
        after_help = "Examples:\n  runlease queues\n  runlease queues show emails\n  runlease queues pause emails\n  runlease queues resume emails\n  runlease queues limit emails --max-running 10 --rate 5/20\n  runlease queues limit emails --max-running none"
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
}

#[derive(Debug, Subcommand)]
enum SchedulesCommand {
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
struct ScheduleArgs {
    /// Schedule name (1 to 128 bytes).
    name: String,
    /// The queue its jobs go to.
    #[arg(long)]
    queue: String,
    /// `minute hour day month weekday`, or six fields with seconds first
    /// (quote it).
    #[arg(long, value_name = "EXPR")]
    cron: String,
    /// IANA time zone the expression is read in (default UTC).
    #[arg(long, value_name = "TZ")]
    timezone: Option<String>,
    /// JSON payload of every job it enqueues (default: read standard input).
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
    /// Priority of its jobs; smaller runs first (default 0).
    #[arg(long)]
    priority: Option<i32>,
    /// Attempt budget of its jobs (default: the coordinator's).
    #[arg(long)]
    max_attempts: Option<i32>,
    /// Run-time limit of one attempt of its jobs, ms.
    #[arg(long)]
    timeout_ms: Option<i64>,
    /// Create it paused: it enqueues nothing until set again without --paused.
    #[arg(long)]
    paused: bool,
}

#[derive(Debug, Subcommand)]
enum QueuesCommand {
    /// Show per-queue figures (the same as `runlease queues`).
    List,
    /// Show one queue's figures and settings.
    ///
    /// Jobs per state, the oldest queued job's age, lease expiries, retries,
    /// and its settings: paused, max_running, max_running_per_key,
    /// rate_limit, and retention ("default": the coordinator's setting).
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
}

/// A limit's new value, or `none` (`OrNone(None)`) to clear it.
#[derive(Debug, Clone, Copy)]
struct OrNone<T>(Option<T>);

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
enum JobsCommand {
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
        /// every state): queued, enqueue_failed, running, done, failed, cancelled.
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
struct BulkArgs {
    /// Queue name.
    #[arg(long)]
    queue: String,
    /// The states to match, comma-separated or repeated (at least one):
    /// queued, enqueue_failed, running, done, failed, cancelled.
    #[arg(long, required = true, value_delimiter = ',', value_parser = parse_state)]
    state: Vec<JobState>,
    /// Only this job; repeat for several (at most 10,000).
    #[arg(long = "id", value_name = "ID", value_delimiter = ',')]
    ids: Vec<String>,
    /// Only jobs created before this instant (RFC 3339).
    #[arg(long, value_name = "RFC3339")]
    created_before: Option<DateTime<Utc>>,
    /// Do it. Without --yes: only count the matching jobs, change nothing, exit 1.
    #[arg(long)]
    yes: bool,
}

/// Most jobs a bulk preview reads when it must filter the listing itself
/// (by --id or --created-before); beyond, it says "at least".
const PREVIEW_SCAN: usize = 10_000;

fn parse_state(s: &str) -> Result<JobState, String> {
    s.trim().parse().map_err(|_| {
        let names: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        format!("{s:?} is not a job state; use {}", names.join(", "))
    })
}

fn state_list(states: &[JobState]) -> String {
    let names: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
    names.join(",")
}

fn parse_id(id: &str) -> anyhow::Result<JobId> {
    id.parse()
        .map_err(|_| anyhow::anyhow!("{id:?} is not a job id (a UUID)"))
}

/// The JSON payload given, or else read from standard input.
fn read_payload(given: Option<String>, how: &str) -> anyhow::Result<serde_json::Value> {
    let text = match given {
        Some(p) => p,
        None => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the JSON payload from standard input (end with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("cannot read the payload from standard input")?;
            if s.trim().is_empty() {
                anyhow::bail!("no payload: {how}");
            }
            s
        }
    };
    serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("payload is not valid JSON: {e}"))
}

fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn when(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
    )
}

fn print_job(job: &Job) {
    let rows: Vec<(&str, String)> = vec![
        ("id", job.id.to_string()),
        ("queue", job.queue.to_string()),
        ("state", job.state.to_string()),
        ("attempt", format!("{}/{}", job.attempt, job.max_attempts)),
        ("run_lease", job.run_lease.to_string()),
        ("priority", job.priority.to_string()),
        ("created_at", when(Some(job.created_at))),
        ("run_at", when(Some(job.run_at))),
        ("finished_at", when(job.finished_at)),
        ("cancel_requested", job.cancel_requested.to_string()),
        (
            "concurrency_key",
            job.concurrency_key.clone().unwrap_or_else(|| "-".into()),
        ),
        ("payload", job.payload.to_string()),
        (
            "progress",
            job.progress.as_ref().map_or("-".into(), ToString::to_string),
        ),
        (
            "result",
            job.result.as_ref().map_or("-".into(), ToString::to_string),
        ),
        ("error", job.error.clone().unwrap_or_else(|| "-".into())),
    ];
    for (k, v) in rows {
        println!("{k:<17} {v}");
    }
    if !job.attempts.is_empty() {
        println!(
            "\n{:<10} {:<24} {:<14} {:<26} error",
            "run_lease", "worker", "outcome", "finished_at"
        );
        for a in &job.attempts {
            let outcome = a.outcome.map_or("running", |o| o.as_str());
            println!(
                "{:<10} {:<24} {:<14} {:<26} {}",
                a.run_lease,
                a.worker_id,
                outcome,
                when(a.finished_at),
                a.error.as_deref().unwrap_or("-")
            );
        }
    }
}

/// `s` cut to `max` characters (on one line), with an ellipsis when cut.
fn snippet(s: &str, max: usize) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    let mut out: String = line.chars().take(max).collect();
    if out.len() < line.len() || s.trim().lines().nth(1).is_some() {
        out.push('…');
    }
    out
}

fn table_time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

fn print_job_header() {
    println!(
        "{:<36} {:<14} {:<8} {:<20} {:<20} error",
        "id", "state", "attempt", "created", "finished"
    );
}

fn print_job_rows(jobs: &[ListedJob]) {
    for ListedJob(job) in jobs {
        println!(
            "{:<36} {:<14} {:<8} {:<20} {:<20} {}",
            job.id.to_string(),
            job.state.as_str(),
            format!("{}/{}", job.attempt, job.max_attempts),
            table_time(Some(job.created_at)),
            table_time(job.finished_at),
            job.error
                .as_deref()
                .map_or_else(|| "-".to_owned(), |e| snippet(e, 60))
        );
    }
}

fn print_queue(q: &QueueSummary) {
    let mut rows: Vec<(String, String)> = vec![("queue".into(), q.queue.to_string())];
    for s in JobState::ALL {
        let n = q.counts.get(s.as_str()).copied().unwrap_or(0);
        rows.push((s.as_str().into(), n.to_string()));
    }
    let set = &q.settings;
    let retention = |v: Option<i64>| match v {
        None => "default".to_owned(),
        Some(0) => "0 (forever)".to_owned(),
        Some(ms) => format!("{ms} ms"),
    };
    rows.extend([
        (
            "oldest_queued_age".into(),
            q.oldest_queued_age_ms.map_or("-".into(), |a| format!("{a} ms")),
        ),
        ("lease_expiries".into(), q.lease_expiries.to_string()),
        ("retries".into(), q.retries.to_string()),
        ("paused".into(), set.paused.to_string()),
        ("max_running".into(), limit_text(set.max_running)),
        ("max_running_per_key".into(), limit_text(set.max_running_per_key)),
        ("rate_limit".into(), rate_text(set.rate_limit)),
        ("retention_done".into(), retention(set.retention_done_ms)),
        ("retention_failed".into(), retention(set.retention_failed_ms)),
    ]);
    for (k, v) in rows {
        println!("{k:<20} {v}");
    }
}

fn limit_text(v: Option<i32>) -> String {
    v.map_or_else(|| "none".to_owned(), |v| v.to_string())
}

fn rate_text(r: Option<RateLimit>) -> String {
    r.map_or_else(
        || "none".to_owned(),
        |r| format!("{}/s, burst {}", r.per_s, r.burst),
    )
}

fn print_schedule(s: &Schedule) {
    let default = |v: Option<String>| v.unwrap_or_else(|| "default".to_owned());
    let rows: Vec<(&str, String)> = vec![
        ("name", s.name.clone()),
        ("queue", s.queue.to_string()),
        ("cron", s.cron.clone()),
        ("timezone", s.timezone.clone()),
        ("paused", s.paused.to_string()),
        ("next_fire_at", when(s.next_fire_at)),
        ("last_fired_at", when(s.last_fired_at)),
        ("payload", s.payload.to_string()),
        ("priority", s.priority.to_string()),
        ("max_attempts", default(s.max_attempts.map(|n| n.to_string()))),
        ("timeout_ms", default(s.timeout_ms.map(|n| n.to_string()))),
        ("created_at", when(Some(s.created_at))),
        ("updated_at", when(Some(s.updated_at))),
    ];
    for (k, v) in rows {
        println!("{k:<14} {v}");
    }
}

/// A table of schedules, each column as wide as its widest cell.
fn print_schedules(schedules: &[Schedule]) {
    let header = [
        "name",
        "queue",
        "cron",
        "timezone",
        "paused",
        "next_fire",
        "last_fire",
    ];
    let rows: Vec<[String; 7]> = schedules
        .iter()
        .map(|s| {
            [
                s.name.clone(),
                s.queue.to_string(),
                s.cron.clone(),
                s.timezone.clone(),
                s.paused.to_string(),
                table_time(s.next_fire_at),
                table_time(s.last_fired_at),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$} "));
            }
        }
        println!("{out}");
    };
    line(&header.map(str::to_owned));
    for row in &rows {
        line(row);
    }
}

async fn run_schedules(client: &Client, command: Option<SchedulesCommand>, json: bool) -> anyhow::Result<()> {
    match command {
        None | Some(SchedulesCommand::List) => {
            let schedules = client.schedules().await?;
            if json {
                print_json(&ListSchedulesResponse { schedules })?
            } else {
                print_schedules(&schedules);
                if schedules.is_empty() {
                    eprintln!("no schedules");
                }
            }
        }
        Some(SchedulesCommand::Set(args)) => {
            let queue = QueueName::new(args.queue).map_err(|e| anyhow::anyhow!("{e}"))?;
            let payload = read_payload(
                args.payload,
                "pass --payload JSON or pipe the JSON on standard input",
            )?;
            let req = PutScheduleRequest {
                queue,
                cron: args.cron,
                timezone: args.timezone,
                payload,
                priority: args.priority,
                max_attempts: args.max_attempts,
                timeout_ms: args.timeout_ms,
                paused: args.paused.then_some(true),
            };
            let schedule = client.put_schedule(&args.name, &req).await?;
            if json {
                print_json(&schedule)?
            } else {
                print_schedule(&schedule)
            }
        }
        Some(SchedulesCommand::Show { name }) => {
            let schedule = client.schedule(&name).await?;
            if json {
                print_json(&schedule)?
            } else {
                print_schedule(&schedule)
            }
        }
        Some(SchedulesCommand::Delete { name }) => {
            let schedule = client.delete_schedule(&name).await?;
            if json {
                print_json(&schedule)?
            } else {
                println!("schedule {} deleted (the jobs it enqueued stay)", schedule.name);
            }
        }
    }
    Ok(())
}

fn action_name(action: BulkActionName) -> &'static str {
    match action {
        BulkActionName::Retry => "retry",
        BulkActionName::Cancel => "cancel",
        BulkActionName::Delete => "delete",
    }
}

/// The states `action` can change (its single-job rule), and the rule in words.
fn action_rule(action: BulkActionName) -> (&'static [JobState], &'static str) {
    match action {
        BulkActionName::Retry => (
            &[JobState::Failed, JobState::Cancelled],
            "retry changes only failed and cancelled jobs",
        ),
        BulkActionName::Cancel => (
            &[JobState::Queued, JobState::EnqueueFailed, JobState::Running],
            "cancel changes only queued, enqueue_failed and running jobs",
        ),
        BulkActionName::Delete => (
            &[JobState::Done, JobState::Failed, JobState::Cancelled],
            "delete changes only done, failed and cancelled jobs",
        ),
    }
}

/// How many jobs a bulk request matches now, and whether that count is
/// exact: the queue's figures when only states filter; otherwise the
/// listing, filtered here, read up to [`PREVIEW_SCAN`] jobs.
async fn count_matching(client: &Client, req: &BulkJobsRequest) -> anyhow::Result<(u64, bool)> {
    let queue = req.queue.as_str();
    if req.ids.is_none() && req.created_before.is_none() {
        let summary = client.queue(queue).await?;
        let n: i64 = req
            .states
            .iter()
            .map(|s| summary.counts.get(s.as_str()).copied().unwrap_or(0))
            .sum();
        return Ok((u64::try_from(n).unwrap_or(0), true));
    }
    let wanted: Option<std::collections::HashSet<JobId>> =
        req.ids.as_ref().map(|ids| ids.iter().copied().collect());
    let mut matched = 0u64;
    let mut read = 0usize;
    let mut cursor: Option<String> = None;
    loop {
        let page = client
            .list_jobs(queue, &req.states, Some(MAX_LIST_LIMIT), cursor.as_deref())
            .await?;
        read += page.jobs.len();
        matched += page
            .jobs
            .iter()
            .filter(|ListedJob(job)| {
                wanted.as_ref().is_none_or(|w| w.contains(&job.id))
                    && req.created_before.is_none_or(|t| job.created_at < t)
            })
            .count() as u64;
        if wanted.as_ref().is_some_and(|w| matched as usize >= w.len()) {
            return Ok((matched, true));
        }
        match page.next_cursor {
            None => return Ok((matched, true)),
            Some(_) if read >= PREVIEW_SCAN => return Ok((matched, false)),
            next => cursor = next,
        }
    }
}

async fn run_bulk(client: &Client, action: BulkActionName, args: BulkArgs, json: bool) -> anyhow::Result<()> {
    let queue = QueueName::new(args.queue).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ids = args
        .ids
        .iter()
        .map(|id| parse_id(id))
        .collect::<anyhow::Result<Vec<JobId>>>()?;
    let mut states = args.state;
    states.sort_unstable_by_key(|s| JobState::ALL.iter().position(|a| a == s));
    states.dedup();
    let req = BulkJobsRequest {
        action,
        queue,
        states,
        ids: (!ids.is_empty()).then_some(ids),
        created_before: args.created_before,
    };
    let name = action_name(action);
    let (changeable, rule) = action_rule(action);
    if !args.yes {
        let (n, exact) = count_matching(client, &req).await?;
        let plural = if req.states.len() == 1 { "" } else { "s" };
        let mut what = format!(
            "jobs of queue {} in state{plural} {}",
            req.queue,
            state_list(&req.states)
        );
        if let Some(t) = req.created_before {
            what.push_str(&format!(" created before {}", when(Some(t))));
        }
        if let Some(ids) = &req.ids {
            what.push_str(&format!(" among the {} ids given", ids.len()));
        }
        let count = if exact {
            format!("{n} match now")
        } else {
            format!("at least {n} match now (counted among the newest {PREVIEW_SCAN} in those states)")
        };
        let note = if req.states.iter().all(|s| changeable.contains(s)) {
            String::new()
        } else {
            format!(" ({rule})")
        };
        anyhow::bail!("would {name} the {what}: {count}{note}; nothing changed, pass --yes to {name} them");
    }
    let answer = client.bulk(&req).await?;
    if json {
        print_json(&answer)?
    } else if answer.changed < answer.matched {
        println!(
            "matched {}, changed {} (the other {} were left as they were: {rule})",
            answer.matched,
            answer.changed,
            answer.matched - answer.changed
        );
    } else {
        println!("matched {}, changed {}", answer.matched, answer.changed);
    }
    Ok(())
}

async fn run_list(
    client: &Client,
    queue: String,
    states: Vec<JobState>,
    limit: Option<u32>,
    cursor: Option<String>,
    all: bool,
    json: bool,
) -> anyhow::Result<()> {
    let limit = limit.or(all.then_some(MAX_LIST_LIMIT));
    let mut cursor = cursor;
    let mut every: Vec<ListedJob> = Vec::new();
    let mut first = true;
    loop {
        let page = client
            .list_jobs(&queue, &states, limit, cursor.as_deref())
            .await?;
        if !all {
            if json {
                print_json(&page)?;
                return Ok(());
            }
            print_job_header();
            print_job_rows(&page.jobs);
            match &page.next_cursor {
                Some(next) => {
                    let mut again = format!("runlease jobs list --queue {queue}");
                    if !states.is_empty() {
                        again.push_str(&format!(" --state {}", state_list(&states)));
                    }
                    if let Some(limit) = limit {
                        again.push_str(&format!(" --limit {limit}"));
                    }
                    eprintln!("more jobs: {again} --cursor {next}   (or --all)");
                }
                None if page.jobs.is_empty() => eprintln!("no matching jobs"),
                None => {}
            }
            return Ok(());
        }
        if json {
            every.extend(page.jobs);
        } else {
            if first {
                print_job_header();
            }
            print_job_rows(&page.jobs);
        }
        first = false;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if json {
        print_json(&ListJobsResponse {
            jobs: every,
            next_cursor: None,
        })?;
    }
    Ok(())
}

fn print_queues(queues: &[QueueSummary]) {
    let states = JobState::ALL;
    print!("{:<24}", "queue");
    for s in states {
        print!(" {:>14}", s.as_str());
    }
    println!(" {:>16} {:>9} {:>8}", "oldest_queued_ms", "expiries", "retries");
    for q in queues {
        print!("{:<24}", q.queue.as_str());
        for s in states {
            print!(" {:>14}", q.counts.get(s.as_str()).copied().unwrap_or(0));
        }
        let age = q.oldest_queued_age_ms.map_or("-".into(), |a| a.to_string());
        println!(" {:>16} {:>9} {:>8}", age, q.lease_expiries, q.retries);
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut builder = Client::builder(&cli.url).retry(RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
    });
    if let Some(key) = &cli.key {
        builder = builder.key(key);
    }
    let client = builder.build()?;
    match cli.command {
        Command::Enqueue {
            queue,
            payload,
            priority,
            run_at,
            delay_ms,
            max_attempts,
            timeout_ms,
            idempotency_key,
            concurrency_key,
        } => {
            let payload = read_payload(payload, "give the JSON as an argument or on standard input")?;
            let queue = QueueName::new(queue).map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut req = EnqueueJobRequest::new(queue, payload);
            req.priority = priority;
            req.run_at = run_at;
            req.delay_ms = delay_ms;
            req.max_attempts = max_attempts;
            req.timeout_ms = timeout_ms;
            req.idempotency_key = idempotency_key;
            req.concurrency_key = concurrency_key;
            let job = client.enqueue_with(req).await?;
            if cli.json {
                print_json(&job)?
            } else {
                print_job(&job)
            }
        }
        Command::Get { id } => {
            let job = client.get(parse_id(&id)?).await?;
            if cli.json {
                print_json(&job)?
            } else {
                print_job(&job)
            }
        }
        Command::Wait { id, timeout_secs } => {
            let id = parse_id(&id)?;
            let show = !cli.json;
            let mut last = String::new();
            let result = client
                .wait_with(id, Duration::from_secs(timeout_secs), |job| {
                    let line = format!(
                        "{} attempt {}/{} progress {}",
                        job.state,
                        job.attempt,
                        job.max_attempts,
                        job.progress.as_ref().map_or("-".into(), ToString::to_string)
                    );
                    if show && line != last {
                        eprintln!("{line}");
                        last = line;
                    }
                })
                .await;
            let job = match result {
                Ok(job) => job,
                Err(Error::WaitTimedOut(job)) => {
                    if cli.json {
                        print_json(&job)?
                    }
                    eprintln!(
                        "runlease: job {} is still {} after {timeout_secs} s",
                        job.id, job.state
                    );
                    return Ok(ExitCode::from(124));
                }
                Err(e) => return Err(e.into()),
            };
            if cli.json {
                print_json(&job)?
            } else {
                print_job(&job)
            }
            if job.state != JobState::Done {
                return Ok(ExitCode::from(2));
            }
        }
        Command::Cancel { id } => {
            let job = client.cancel(parse_id(&id)?).await?;
            if cli.json {
                print_json(&job)?
            } else {
                print_job(&job)
            }
        }
        Command::Retry { id } => {
            let job = client.retry(parse_id(&id)?).await?;
            if cli.json {
                print_json(&job)?
            } else {
                print_job(&job)
            }
        }
        Command::Queues {
            command: None | Some(QueuesCommand::List),
        } => {
            let queues = client.queues().await?;
            if cli.json {
                print_json(&serde_json::json!({ "queues": queues }))?
            } else {
                print_queues(&queues)
            }
        }
        Command::Queues {
            command: Some(QueuesCommand::Show { queue }),
        } => {
            let summary = client.queue(&queue).await?;
            if cli.json {
                print_json(&summary)?
            } else {
                print_queue(&summary)
            }
        }
        Command::Queues {
            command: Some(verb @ (QueuesCommand::Pause { .. } | QueuesCommand::Resume { .. })),
        } => {
            let (queue, paused) = match verb {
                QueuesCommand::Pause { queue } => (queue, true),
                QueuesCommand::Resume { queue } => (queue, false),
                _ => unreachable!("matched above"),
            };
            let change = UpdateQueueRequest {
                paused: Some(Some(paused)),
                ..UpdateQueueRequest::default()
            };
            let summary = client.update_queue(&queue, &change).await?;
            let queued = summary.counts.get("queued").copied().unwrap_or(0);
            if cli.json {
                print_json(&summary)?
            } else if paused {
                println!(
                    "queue {} paused: it takes enqueues and hands out no claims until `runlease queues resume {}` ({queued} queued)",
                    summary.queue, summary.queue,
                );
            } else {
                println!(
                    "queue {} resumed: claims get its jobs again ({queued} queued)",
                    summary.queue
                );
            }
        }
        Command::Queues {
            command:
                Some(QueuesCommand::Limit {
                    queue,
                    max_running,
                    max_running_per_key,
                    rate,
                }),
        } => {
            if max_running.is_none() && max_running_per_key.is_none() && rate.is_none() {
                anyhow::bail!(
                    "nothing to change: pass --max-running, --max-running-per-key or --rate (a value, or none to clear it)"
                );
            }
            let change = UpdateQueueRequest {
                max_running: max_running.map(|v| v.0),
                max_running_per_key: max_running_per_key.map(|v| v.0),
                rate_limit: rate.map(|v| v.0),
                ..UpdateQueueRequest::default()
            };
            let summary = client.update_queue(&queue, &change).await?;
            if cli.json {
                print_json(&summary)?
            } else {
                let set = &summary.settings;
                println!(
                    "queue {}: max_running {}, max_running_per_key {}, rate_limit {}",
                    summary.queue,
                    limit_text(set.max_running),
                    limit_text(set.max_running_per_key),
                    rate_text(set.rate_limit)
                );
            }
        }
        Command::Schedules { command } => run_schedules(&client, command, cli.json).await?,
        Command::Jobs { command } => match command {
            JobsCommand::List {
                queue,
                state,
                limit,
                cursor,
                all,
            } => run_list(&client, queue, state, limit, cursor, all, cli.json).await?,
            JobsCommand::Retry(args) => run_bulk(&client, BulkActionName::Retry, args, cli.json).await?,
            JobsCommand::Cancel(args) => run_bulk(&client, BulkActionName::Cancel, args, cli.json).await?,
            JobsCommand::Delete(args) => run_bulk(&client, BulkActionName::Delete, args, cli.json).await?,
        },
    }
    Ok(ExitCode::SUCCESS)
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print and succeed; usage errors exit 1 with one
        // line, like every other error (2 is `wait`'s "failed or cancelled").
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // No subcommand at all: show the whole usage, and fail.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::FAILURE;
        }
        // The message up to clap's first blank line, on one line (a missing
        // argument's name is on the line after "not provided:").
        Err(e) => {
            let text = e.to_string();
            let parts: Vec<&str> = text
                .trim_start()
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let line = if parts.is_empty() {
                "invalid arguments".to_owned()
            } else {
                parts.join(" ")
            };
            eprintln!("runlease: {}", line.trim_start_matches("error: "));
            return ExitCode::FAILURE;
        }
    };
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            let line = e.to_string().replace('\n', " ");
            eprintln!("runlease: {line}");
            ExitCode::FAILURE
        }
    }
}
