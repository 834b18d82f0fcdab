//! `runlease-chaos`: a chaos soak of the whole system. It builds a world of
//! its own — a PostgreSQL primary with a synchronous streaming standby
//! (`initdb` and `pg_basebackup` in a temporary directory, free ports), a
//! redis-server, two or three coordinator processes each reaching both
//! PostgreSQL servers through TCP proxies, and worker processes speaking HTTP (the
//! `worker` mode of this binary), one of them through a proxy too, and an
//! HTTP endpoint (the `endpoint` mode) serving a second queue whose jobs the
//! coordinators push — then
//! enqueues jobs at a steady rate while it injects, on a schedule: workers
//! SIGKILLed mid-job and replaced, a worker stopped (SIGSTOP) past its lease
//! that then tries to finish, jobs whose handler stalls past its lease, a
//! coordinator SIGKILLed and restarted, Redis stopped, PostgreSQL restarted
//! (`pg_ctl restart -m fast`), the PostgreSQL primary crashed and its standby
//! promoted (then a new standby made), a worker partitioned from its coordinator past
//! the TTL, the database connections of a coordinator frozen, and the
//! endpoint SIGKILLed mid-request and restarted (besides the answers it
//! loses on purpose).
//!
//! At the end it checks every job against the database and the workers' own
//! logs (see `verify`) and exits 1 when a target is missed: 0 jobs lost, 0
//! stale outcomes accepted, at least 95% of jobs terminal within 25 s of
//! their enqueue.
//!
//! ```sh
//! cargo build -p runlease-coordinator -p runlease-bench --bin runlease-coordinator --bin runlease-chaos
//! target/debug/runlease-chaos soak --short          # a few minutes; what CI runs
//! cargo build --release -p runlease-coordinator -p runlease-bench --bin runlease-coordinator --bin runlease-chaos
//! target/release/runlease-chaos soak --jobs 100000  # the long soak
//! ```
//!
//! Layout: the private PostgreSQL is the test crate's `PgCluster`; `jobs` (payloads and the
//! results they determine), `worker` (the worker mode), `endpoint` (the
//! endpoint mode), `process` (the
//! coordinator processes, signals), `producer` (the enqueueing), `soak` (the
//! world and the fault schedule), `verify` (the checks and the report).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod endpoint;
mod jobs;
mod process;
mod producer;
mod soak;
mod verify;
mod worker;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// A chaos soak of the whole system: private PostgreSQL, Redis,
/// coordinators and workers, faults injected on a schedule, every job
/// checked at the end.
#[derive(Parser)]
#[command(name = "runlease-chaos")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the soak; exits 1 when a target is missed.
    Soak(SoakOptions),
    /// A worker process of the soak (the soak starts these itself).
    Worker(WorkerOptions),
    /// The endpoint process of the soak's endpoint-served queue (the soak
    /// starts it itself; the secret comes in RUNLEASE_ENDPOINT_SECRET).
    Endpoint(EndpointOptions),
}

/// The endpoint mode's options.
#[derive(Args)]
struct EndpointOptions {
    /// Where it listens, 127.0.0.1:PORT.
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// Where the pushes it read go (appended).
    #[arg(long, value_name = "FILE")]
    log: PathBuf,
    /// Its name in the results it answers.
    #[arg(long)]
    id: String,
    /// The queue's endpoint secret.
    #[arg(long, env = "RUNLEASE_ENDPOINT_SECRET", hide_env_values = true)]
    secret: String,
    /// The handler's run time, ms, drawn per push from `LO..HI`.
    #[arg(long, value_name = "LO..HI", default_value = "5..40", value_parser = parse_range)]
    work_ms: (u64, u64),
}

/// The soak's options: `--short` picks the short soak's values, and each
/// option given overrides the mode's.
#[derive(Args)]
struct SoakOptions {
    /// The short soak (every fault once, a few minutes): what CI runs.
    #[arg(long)]
    short: bool,
    /// Jobs to enqueue.
    #[arg(long)]
    jobs: Option<u64>,
    /// Enqueue rate, jobs/s.
    #[arg(long)]
    rate: Option<f64>,
    /// Coordinator processes, 2 or 3.
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(2..=3))]
    coordinators: Option<usize>,
    /// Worker processes at any time (3 or more).
    #[arg(long, value_parser = RangedU64ValueParser::<usize>::new().range(3..))]
    workers: Option<usize>,
    /// Jobs each worker holds at once.
    #[arg(long)]
    concurrency: Option<usize>,
    /// How long Redis stays stopped, seconds.
    #[arg(long, value_name = "S")]
    redis_outage_s: Option<u64>,
    /// Seed of the victims' choice and the handlers' run times.
    #[arg(long)]
    seed: Option<u64>,
    /// The coordinator binary (default: the one beside this binary).
    #[arg(long, value_name = "PATH", conflicts_with = "profile")]
    coordinator_binary: Option<PathBuf>,
    /// The coordinator of this profile's build: `target/<profile>/runlease-coordinator`.
    #[arg(long, value_enum)]
    profile: Option<Profile>,
    /// Keep the temporary directory (logs, data) even when the soak passes.
    #[arg(long)]
    keep: bool,
}

/// A cargo profile whose coordinator build the soak runs.
#[derive(Clone, Copy, ValueEnum)]
enum Profile {
    Debug,
    Release,
}

/// The worker mode's options.
#[derive(Args)]
struct WorkerOptions {
    /// Coordinator (or proxy) base URL.
    #[arg(long, value_name = "URL")]
    coordinator: String,
    /// Where acknowledged outcomes go (appended).
    #[arg(long, value_name = "FILE")]
    log: PathBuf,
    /// The worker id it claims under.
    #[arg(long)]
    id: String,
    /// Jobs it holds at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// The handler's run time, ms, drawn per job from `LO..HI`.
    #[arg(long, value_name = "LO..HI", default_value = "5..40", value_parser = parse_range)]
    work_ms: (u64, u64),
}

fn parse_range(s: &str) -> anyhow::Result<(u64, u64)> {
    let (lo, hi) = s.split_once("..").context("a range is LO..HI")?;
    let (lo, hi) = (lo.parse()?, hi.parse()?);
    if lo > hi {
        bail!("{s}: LO is above HI");
    }
    Ok((lo, hi))
}

impl WorkerOptions {
    fn into_args(self) -> worker::WorkerArgs {
        worker::WorkerArgs {
            coordinator: self.coordinator,
            log: self.log,
            id: self.id,
            concurrency: self.concurrency,
            work_ms: self.work_ms,
        }
    }
}

impl SoakOptions {
    fn into_args(self) -> anyhow::Result<soak::SoakArgs> {
        let mut args = if self.short {
            soak::SoakArgs::short()
        } else {
            soak::SoakArgs::long()
        };
        args.keep = self.keep;
        if let Some(jobs) = self.jobs {
            args.jobs = jobs;
        }
        if let Some(rate) = self.rate {
            args.rate = rate;
        }
        if let Some(n) = self.coordinators {
            args.coordinators = n;
        }
        if let Some(n) = self.workers {
            args.workers = n;
        }
        if let Some(n) = self.concurrency {
            args.concurrency = n;
        }
        if let Some(s) = self.redis_outage_s {
            args.redis_outage = Duration::from_secs(s);
        }
        if let Some(seed) = self.seed {
            args.seed = seed;
        }
        if args.jobs == 0 || args.rate <= 0.0 {
            bail!("--jobs and --rate must be positive");
        }
        args.coordinator_binary = match (self.coordinator_binary, self.profile) {
            (Some(path), _) => path,
            (None, Some(profile)) => {
                let exe = std::env::current_exe()?;
                let target = exe
                    .parent()
                    .and_then(|d| d.parent())
                    .context("the binary is not under target/<profile>/")?;
                let dir = match profile {
                    Profile::Debug => "debug",
                    Profile::Release => "release",
                };
                target.join(dir).join("runlease-coordinator")
            }
            (None, None) => runlease_tests::process::coordinator_binary(),
        };
        if !args.coordinator_binary.exists() {
            bail!(
                "{} is missing: build it (cargo build [--release] -p runlease-coordinator)",
                args.coordinator_binary.display()
            );
        }
        Ok(args)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Worker(options) => worker::run(options.into_args()).await,
        Command::Endpoint(o) => {
            endpoint::run(endpoint::EndpointArgs {
                listen: o.listen,
                log: o.log,
                id: o.id,
                secret: o.secret,
                work_ms: o.work_ms,
            })
            .await
        }
        Command::Soak(options) => {
            let passed = soak::run(options.into_args()?).await?;
            if !passed {
                std::process::exit(1);
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn the_worker_takes_what_the_soak_passes() {
        let cli = Cli::try_parse_from([
            "runlease-chaos",
            "worker",
            "--coordinator",
            "http://127.0.0.1:1",
            "--log",
            "w.jsonl",
            "--id",
            "w1",
            "--concurrency",
            "10",
            "--work-ms",
            "20..1500",
        ])
        .unwrap();
        let Command::Worker(w) = cli.command else {
            panic!("not the worker mode");
        };
        assert_eq!((w.concurrency, w.work_ms), (10, (20, 1_500)));
        assert!(parse_range("9..1").is_err());
    }

    #[test]
    fn options_override_the_mode_wherever_they_come() {
        let cli = Cli::try_parse_from(["runlease-chaos", "soak", "--jobs", "50", "--short"]).unwrap();
        let Command::Soak(s) = cli.command else {
            panic!("not the soak");
        };
        assert!(s.short);
        assert_eq!((s.jobs, s.concurrency), (Some(50), None));
        for bad in [["--coordinators", "4"], ["--workers", "2"]] {
            let args = ["runlease-chaos", "soak", bad[0], bad[1]];
            assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
        }
    }
}
