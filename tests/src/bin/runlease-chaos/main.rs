//! `runlease-chaos`: a chaos soak of the whole system. It builds a world of
//! its own — a PostgreSQL cluster (`initdb` in a temporary directory, a free
//! port), a redis-server, two or three coordinator processes each reaching
//! PostgreSQL through a TCP proxy, and worker processes speaking HTTP (the
//! `worker` mode of this binary), one of them through a proxy too — then
//! enqueues jobs at a steady rate while it injects, on a schedule: workers
//! SIGKILLed mid-job and replaced, a worker stopped (SIGSTOP) past its lease
//! that then tries to finish, jobs whose handler stalls past its lease, a
//! coordinator SIGKILLed and restarted, Redis stopped, PostgreSQL restarted
//! (`pg_ctl restart -m fast`), a worker partitioned from its coordinator past
//! the TTL, and the database connections of a coordinator frozen.
//!
//! At the end it checks every job against the database and the workers' own
//! logs (see `verify`) and exits 1 when a target is missed: 0 jobs lost, 0
//! stale outcomes accepted, at least 95% of jobs terminal within 25 s of
//! their enqueue.
//!
//! ```sh
//! cargo build -p runlease-coordinator -p runlease-tests --bins
//! target/debug/runlease-chaos --short          # a few minutes; what CI runs
//! cargo build --release -p runlease-coordinator -p runlease-tests --bin runlease-coordinator --bin runlease-chaos
//! target/release/runlease-chaos --jobs 100000  # the long soak
//! ```
//!
//! Layout: `cluster` (the private PostgreSQL), `jobs` (payloads and the
//! results they determine), `worker` (the worker mode), `process` (the
//! coordinator processes, signals), `producer` (the enqueueing), `soak` (the
//! world and the fault schedule), `verify` (the checks and the report).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod cluster;
mod jobs;
mod process;
mod producer;
mod soak;
mod verify;
mod worker;

use std::time::Duration;

use anyhow::{Context, bail};

const USAGE: &str = "\
runlease-chaos [--short] [--jobs N] [--rate JOBS_PER_S] [--coordinators 2|3]
               [--workers N] [--concurrency N] [--redis-outage-s S]
               [--coordinator-binary PATH | --profile debug|release] [--keep] [--seed N]
runlease-chaos worker --coordinator URL --log FILE --id ID [--concurrency N] [--work-ms LO..HI]";

fn parse_range(s: &str) -> anyhow::Result<(u64, u64)> {
    let (lo, hi) = s.split_once("..").context("a range is LO..HI")?;
    let (lo, hi) = (lo.parse()?, hi.parse()?);
    if lo > hi {
        bail!("{s}: LO is above HI");
    }
    Ok((lo, hi))
}

fn worker_args(mut it: impl Iterator<Item = String>) -> anyhow::Result<worker::WorkerArgs> {
    let mut coordinator = None;
    let mut log = None;
    let mut id = None;
    let mut concurrency = 8;
    let mut work_ms = (5, 40);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--coordinator" => coordinator = Some(value()?),
            "--log" => log = Some(value()?.into()),
            "--id" => id = Some(value()?),
            "--concurrency" => concurrency = value()?.parse()?,
            "--work-ms" => work_ms = parse_range(&value()?)?,
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    Ok(worker::WorkerArgs {
        coordinator: coordinator.context("worker needs --coordinator URL")?,
        log: log.context("worker needs --log FILE")?,
        id: id.context("worker needs --id ID")?,
        concurrency,
        work_ms,
    })
}

fn soak_args(mut it: impl Iterator<Item = String>) -> anyhow::Result<soak::SoakArgs> {
    let mut args = soak::SoakArgs::long();
    let mut explicit: Vec<(String, String)> = Vec::new();
    let mut binary = None;
    let mut profile = None;
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--short" => args = soak::SoakArgs::short(),
            "--keep" => args.keep = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            "--jobs"
            | "--rate"
            | "--coordinators"
            | "--workers"
            | "--concurrency"
            | "--redis-outage-s"
            | "--seed"
            | "--coordinator-binary"
            | "--profile" => {
                let value = it.next().with_context(|| format!("{flag} needs a value"))?;
                explicit.push((flag, value));
            }
            other => bail!("unknown argument {other}\n{USAGE}"),
        }
    }
    // Explicit values override the mode's, wherever they came on the line.
    let keep = args.keep;
    for (flag, value) in explicit {
        match flag.as_str() {
            "--jobs" => args.jobs = value.parse()?,
            "--rate" => args.rate = value.parse()?,
            "--coordinators" => args.coordinators = value.parse()?,
            "--workers" => args.workers = value.parse()?,
            "--concurrency" => args.concurrency = value.parse()?,
            "--redis-outage-s" => args.redis_outage = Duration::from_secs(value.parse()?),
            "--seed" => args.seed = value.parse()?,
            "--coordinator-binary" => binary = Some(value.into()),
            _ => profile = Some(value),
        }
    }
    args.keep = keep;
    if !(2..=3).contains(&args.coordinators) {
        bail!("--coordinators takes 2 or 3");
    }
    if args.workers < 3 || args.jobs == 0 || args.rate <= 0.0 {
        bail!("--workers takes 3 or more; --jobs and --rate must be positive");
    }
    args.coordinator_binary = match (binary, profile) {
        (Some(path), _) => path,
        (None, Some(p)) if p == "debug" || p == "release" => {
            let exe = std::env::current_exe()?;
            let target = exe
                .parent()
                .and_then(|d| d.parent())
                .context("the binary is not under target/<profile>/")?;
            target.join(p).join("runlease-coordinator")
        }
        (None, Some(p)) => bail!("--profile takes debug or release, not {p}"),
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut it = std::env::args().skip(1).peekable();
    if it.peek().map(String::as_str) == Some("worker") {
        it.next();
        return worker::run(worker_args(it)?).await;
    }
    let args = soak_args(it)?;
    let passed = soak::run(args).await?;
    if !passed {
        std::process::exit(1);
    }
    Ok(())
}
