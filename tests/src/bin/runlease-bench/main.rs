//! `runlease-bench`: what runlease sustains on this machine, measured, not
//! asserted. Modes:
//!
//! - default (`--workers 1,16,256,1024 --jobs 20000 --concurrency 8`): for each
//!   worker count, a coordinator in-process on a fresh database, the jobs
//!   enqueued in batches, then that many workers of the client's runtime until
//!   every job is done — once with batching off (one statement per request)
//!   and once with it on. It also measures PostgreSQL alone running the same
//!   guarded statements with 100 jobs each, and prints runlease as a ratio to
//!   it. Per run: jobs/s (drain; and with enqueue), claim→complete and
//!   enqueue→start p50/p99, PostgreSQL transactions per job.
//! - `--wake N`: wake latency between two coordinators (enqueue on A → parked
//!   claim answered on B), with Redis and with Redis stopped.
//! - `--parked N`: N long-poll claims parked on one coordinator process:
//!   its PostgreSQL connections and resident memory.
//!
//! ```sh
//! cargo build --release -p runlease-coordinator -p runlease-tests
//! target/release/runlease-bench
//! target/release/runlease-bench --wake 200
//! target/release/runlease-bench --parked 10000
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod parked;
mod raw;
mod stats;
mod throughput;
mod wake;

use anyhow::{Context, bail};

struct Args {
    workers: Vec<usize>,
    jobs: usize,
    concurrency: usize,
    wake: Option<usize>,
    parked: Option<usize>,
    modes: Vec<bool>,
    lean: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        workers: vec![1, 16, 256, 1024],
        jobs: 20_000,
        concurrency: 8,
        wake: None,
        parked: None,
        modes: vec![false, true],
        lean: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--workers" => {
                args.workers = value()?
                    .split(',')
                    .map(|w| w.trim().parse())
                    .collect::<Result<_, _>>()?;
            }
            "--jobs" => args.jobs = value()?.parse()?,
            "--concurrency" => args.concurrency = value()?.parse()?,
            "--batching" => {
                args.modes = match value()?.as_str() {
                    "on" => vec![true],
                    "off" => vec![false],
                    "both" => vec![false, true],
                    other => bail!("--batching takes on, off or both, not {other}"),
                }
            }
            "--wake" => args.wake = Some(value()?.parse()?),
            "--lean" => args.lean = true,
            "--parked" => args.parked = Some(value()?.parse()?),
            "-h" | "--help" => {
                println!(
                    "runlease-bench [--workers 1,16,256,1024] [--jobs 20000] [--concurrency 8] [--batching on|off|both]"
                );
                println!(
                    "runlease-bench --wake 200      wake latency between two coordinators, Redis up and down"
                );
                println!(
                    "runlease-bench --parked 10000  parked long-polls on one coordinator: connections, memory"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}; see --help"),
        }
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if let Some(rounds) = args.wake {
        return wake::report(rounds).await;
    }
    if let Some(n) = args.parked {
        return parked::report(n).await;
    }
    let kind = if args.lean {
        throughput::WorkerKind::Lean
    } else {
        throughput::WorkerKind::Runtime
    };
    throughput::report(&args.workers, args.jobs, args.concurrency, &args.modes, kind).await
}
