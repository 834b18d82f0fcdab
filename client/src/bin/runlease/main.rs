//! `runlease`: enqueue, inspect, wait for, cancel and retry jobs from a shell;
//! list a queue's jobs and act on many at once (`jobs`); show, pause, resume,
//! limit and set the retention of a queue (`queues`); list, set, show and
//! delete cron schedules (`schedules`); print shell completions
//! (`completions`).
//!
//! Exit status: 0 on success; 1 on any error, and for a bulk action run
//! without `--yes`; for `wait`, 2 when the job ended failed or cancelled and
//! 124 when the wait ran out. An error is one `runlease: ...` line on stderr,
//! or with `--json` the protocol's `{"error": {"code", "message"}}` there
//! (the codes are in `failure`).
//!
//! Layout: `args` (the command line), `failure` (errors and their codes),
//! `output` (tables and JSON), `jobs`, `queues`, `schedules` (the verbs with
//! sub-verbs).

mod args;
mod failure;
mod jobs;
mod output;
mod queues;
mod schedules;

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use runlease_client::protocol::admin::BulkActionName;
use runlease_client::protocol::producer::EnqueueJobRequest;
use runlease_client::protocol::{JobId, JobState, OnDependencyFailure, QueueName};
use runlease_client::{Client, Error, RetryPolicy};

use args::{Cli, Command, JobsCommand};
use failure::{Failure, USAGE};
use output::{print_job, print_json};

/// `id` as a job id, or a refusal that says what a job id is.
fn parse_id(id: &str) -> Result<JobId, Failure> {
    id.parse()
        .map_err(|_| Failure::invalid(format!("{id:?} is not a job id (a UUID)")))
}

/// The JSON payload given, or else read from standard input.
fn read_payload(given: Option<String>, how: &str) -> Result<serde_json::Value, Failure> {
    let text = match given {
        Some(p) => p,
        None => {
            if std::io::stdin().is_terminal() {
                eprintln!("reading the JSON payload from standard input (end with Ctrl-D)");
            }
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| {
                Failure::new(
                    failure::IO,
                    format!("cannot read the payload from standard input: {e}"),
                )
            })?;
            if s.trim().is_empty() {
                return Err(Failure::invalid(format!("no payload: {how}")));
            }
            s
        }
    };
    serde_json::from_str(&text).map_err(|e| Failure::invalid(format!("payload is not valid JSON: {e}")))
}

/// Prints `job` as asked: the protocol's JSON, or a table.
fn show_job(job: &runlease_client::protocol::Job, json: bool) -> Result<(), Failure> {
    if json {
        print_json(job)
    } else {
        print_job(job);
        Ok(())
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    if let Command::Completions { shell } = cli.command {
        // Into a buffer first: clap_complete panics on a failed write (a
        // closed pipe); this way it is an `io` failure like any other.
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut Cli::command(), "runlease", &mut script);
        std::io::stdout().write_all(&script)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut builder = Client::builder(&cli.url).retry(RetryPolicy {
        max_attempts: 3,
        base_delay: Duration::from_millis(100),
        max_delay: Duration::from_secs(1),
    });
    if let Some(key) = &cli.key {
        builder = builder.key(key);
    }
    let client = builder.build()?;
    let json = cli.json;
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
            depends_on,
            on_dependency_failure,
        } => {
            let payload = read_payload(payload, "give the JSON as an argument or on standard input")?;
            let queue = QueueName::new(queue).map_err(|e| Failure::invalid(e.to_string()))?;
            let mut req = EnqueueJobRequest::new(queue, payload);
            req.priority = priority;
            req.run_at = run_at;
            req.delay_ms = delay_ms;
            req.max_attempts = max_attempts;
            req.timeout_ms = timeout_ms;
            req.idempotency_key = idempotency_key;
            req.concurrency_key = concurrency_key;
            for id in &depends_on {
                req.depends_on.push(parse_id(id)?.to_string());
            }
            req.on_dependency_failure = on_dependency_failure.map(|f| match f {
                args::DependencyFailure::Cancel => OnDependencyFailure::Cancel,
                args::DependencyFailure::Run => OnDependencyFailure::Run,
            });
            show_job(&client.enqueue_with(req).await?, json)?;
        }
        Command::Get { id } => show_job(&client.get(parse_id(&id)?).await?, json)?,
        Command::Wait {
            id,
            wait_ms,
            timeout_secs,
        } => {
            let id = parse_id(&id)?;
            let wait = match timeout_secs {
                Some(secs) => Duration::from_secs(secs),
                None => Duration::from_millis(wait_ms),
            };
            let mut last = String::new();
            let result = client
                .wait_with(id, wait, |job| {
                    let line = format!(
                        "{} attempt {}/{} progress {}",
                        job.state,
                        job.attempt,
                        job.max_attempts,
                        job.progress.as_ref().map_or("-".into(), ToString::to_string)
                    );
                    if !json && line != last {
                        eprintln!("{line}");
                        last = line;
                    }
                })
                .await;
            let job = match result {
                Ok(job) => job,
                Err(Error::WaitTimedOut(job)) => {
                    // The job as last seen on stdout, then the time-out.
                    if json {
                        print_json(&job)?
                    }
                    return Err(Failure::timed_out(format!(
                        "job {} is still {} after {} ms",
                        job.id,
                        job.state,
                        wait.as_millis()
                    )));
                }
                Err(e) => return Err(e.into()),
            };
            show_job(&job, json)?;
            if job.state != JobState::Done {
                return Ok(ExitCode::from(2));
            }
        }
        Command::Cancel { id } => show_job(&client.cancel(parse_id(&id)?).await?, json)?,
        Command::Retry { id } => show_job(&client.retry(parse_id(&id)?).await?, json)?,
        Command::Queues { command } => queues::run_queues(&client, command, json).await?,
        Command::Schedules { command } => schedules::run_schedules(&client, command, json).await?,
        Command::Jobs { command } => match command {
            JobsCommand::List {
                queue,
                state,
                limit,
                cursor,
                all,
            } => jobs::run_list(&client, queue, state, limit, cursor, all, json).await?,
            JobsCommand::Retry(args) => jobs::run_bulk(&client, BulkActionName::Retry, args, json).await?,
            JobsCommand::Cancel(args) => jobs::run_bulk(&client, BulkActionName::Cancel, args, json).await?,
            JobsCommand::Delete(args) => jobs::run_bulk(&client, BulkActionName::Delete, args, json).await?,
        },
        Command::Completions { .. } => unreachable!("answered above"),
    }
    Ok(ExitCode::SUCCESS)
}

/// A command line that did not parse, as a `usage` failure: clap's message
/// up to its first blank line, on one line (a missing argument's name is on
/// the line after "not provided:").
fn usage_failure(e: &clap::Error) -> Failure {
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
    Failure::new(USAGE, line.trim_start_matches("error: "))
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
        Err(e) => {
            let json = failure::json_requested(std::env::args_os());
            // No verb at all: the whole usage, and a failure.
            if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                if !json {
                    let _ = e.print();
                    return ExitCode::FAILURE;
                }
                return Failure::new(USAGE, "no verb given: `runlease --help` lists them").report(true);
            }
            return usage_failure(&e).report(json);
        }
    };
    let json = cli.json;
    match run(cli).await {
        Ok(code) => code,
        Err(failure) => failure.report(json),
    }
}
