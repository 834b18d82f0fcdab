//! `runlease`: enqueue, inspect, wait for, cancel and retry jobs from a shell.
//! Exit status: 0 on success; 1 on any error (one line on stderr); for `wait`,
//! 2 when the job ended failed or cancelled and 124 when the wait timed out.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use runlease_client::protocol::producer::{EnqueueJobRequest, QueueSummary};
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
        global = true
    )]
    url: String,
    /// API key (Authorization: Bearer).
    #[arg(long, env = "RUNLEASE_KEY", hide_env_values = true, global = true)]
    key: Option<String>,
    /// Print exactly what the coordinator answered, as JSON.
    #[arg(long, global = true)]
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
    /// Show per-queue figures.
    Queues,
}

fn parse_id(id: &str) -> anyhow::Result<JobId> {
    id.parse()
        .map_err(|_| anyhow::anyhow!("{id:?} is not a job id (a UUID)"))
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
        } => {
            let text = match payload {
                Some(p) => p,
                None => {
                    if std::io::stdin().is_terminal() {
                        eprintln!("reading the JSON payload from standard input (end with Ctrl-D)");
                    }
                    let mut s = String::new();
                    std::io::stdin()
                        .read_to_string(&mut s)
                        .context("cannot read the payload from standard input")?;
                    s
                }
            };
            let payload =
                serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("payload is not valid JSON: {e}"))?;
            let queue = QueueName::new(queue).map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut req = EnqueueJobRequest::new(queue, payload);
            req.priority = priority;
            req.run_at = run_at;
            req.delay_ms = delay_ms;
            req.max_attempts = max_attempts;
            req.timeout_ms = timeout_ms;
            req.idempotency_key = idempotency_key;
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
        Command::Queues => {
            let queues = client.queues().await?;
            if cli.json {
                print_json(&serde_json::json!({ "queues": queues }))?
            } else {
                print_queues(&queues)
            }
        }
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
        Err(e) => {
            let text = e.to_string();
            let line = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("invalid arguments");
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
