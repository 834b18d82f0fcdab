//! `runlease-bench`: what runlease sustains on this machine, measured, not
//! asserted. Modes:
//!
//! - default (`--workers 1,16,256,1024 --jobs 20000 --concurrency 8`): for each
//!   worker count, a coordinator in-process on a fresh database, the jobs
//!   enqueued in batches, then that many workers of the client's runtime until
//!   every job is done — once with batching off (one statement per request)
//!   and once with it on. Between runs it measures PostgreSQL alone running
//!   the same guarded statements with 100 jobs each, and prints each run as a
//!   ratio to the mean of the two measurements around it (the machine's speed
//!   drifts with its neighbours' load). Per run: jobs/s (drain; and with
//!   enqueue), claim→complete and enqueue→start p50/p99, PostgreSQL
//!   transactions per job, and CPU per job of this process (coordinator and
//!   workers) and of the rest of the machine (PostgreSQL). `--no-baseline`
//!   skips PostgreSQL alone (for profiling); `--repeat N` runs everything N
//!   times and ends with the median jobs/s and ×PG of each run.
//! - `--lean`: bare protocol workers instead of the runtime (claim up to
//!   `--concurrency`, complete them in one `/v1/finish`), with a third mode,
//!   `per-job`: batching off and one `/v1/complete` per lease.
//! - `--wake N`: wake latency between two coordinators (enqueue on A → parked
//!   claim answered on B), with Redis and with Redis stopped.
//! - `--parked N`: N long-poll claims parked on one coordinator process:
//!   its PostgreSQL connections and resident memory.
//! - `--flow OLD_BINARY[,...]`: an unlimited queue drained by older builds
//!   and by this one (interleaved, `--repeat` rounds), and a queue with
//!   `max_running = 100`, each build over a database it migrated itself.
//! - `--drain [NAME=]BINARY[,...]` (default: this build's coordinator beside
//!   the bench binary): each build as its own process on a fresh database,
//!   outside HTTP workers (`--workers`, default 16,256) draining `--jobs`
//!   preloaded jobs, in the same run as a PostgreSQL roofline (pgbench, a
//!   plain table, claim 100 with `FOR UPDATE SKIP LOCKED` and a guarded
//!   complete of 100, 16 clients); drain jobs/s, × roofline, PostgreSQL
//!   transactions, WAL bytes and CPU per job, coordinator CPU, HTTP requests
//!   per job, claim→complete and enqueue→start p50/p99; medians of
//!   `--repeat` interleaved rounds. `--graphile tests/peers/graphile-worker`
//!   (after `npm ci` there) adds graphile-worker 0.17 in its batched mode,
//!   measured the same way. `--coordinators 1,3` runs each build as that
//!   many processes over one database, the workers spread over them (the
//!   scale-out figures). See `drain.rs` and `roofline.rs`.
//! - `--pg-parts`: PostgreSQL's work per job (shared buffers, WAL, the
//!   backend's CPU) with the coordinator's claim and finish statements on one
//!   connection, on the schema as migrated and on variants each without one
//!   of its parts (an index, the checks, the primary key's uniqueness) or
//!   with ended jobs moved to a history table: what each part costs;
//!   `--slots N` sets the claims' size (default 512, a claim at 256
//!   workers; 64 is about a batch at 16 workers). See `parts.rs`.
//! - `--history 0,1000000,10000000`: `/metrics` and `/v1/queues` latency and
//!   the drain rate of `--jobs` fresh jobs as terminal history grows, then
//!   pruning: its rate over that history, and beside a sustained drain.
//!
//! ```sh
//! cargo build --release -p runlease-coordinator -p runlease-tests
//! target/release/runlease-bench
//! target/release/runlease-bench --wake 200
//! target/release/runlease-bench --parked 10000
//! target/release/runlease-bench --history 0,1000000,10000000
//! target/release/runlease-bench --pg-parts --repeat 5
//! target/release/runlease-bench --drain old=../old/runlease-coordinator,new=target/release/runlease-coordinator --repeat 3
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod drain;
mod flow;
mod history;
mod parked;
mod parts;
mod raw;
mod roofline;
mod stats;
mod throughput;
mod wake;

use anyhow::{Context, bail};

/// The coordinator binary's allocator, so the in-process coordinator is
/// measured as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    workers: Vec<usize>,
    jobs: usize,
    concurrency: usize,
    wake: Option<usize>,
    parked: Option<usize>,
    history: Option<Vec<usize>>,
    flow: Option<Vec<std::path::PathBuf>>,
    drain: Option<Vec<drain::System>>,
    graphile: Option<std::path::PathBuf>,
    workers_given: bool,
    modes: Option<Vec<throughput::Mode>>,
    lean: bool,
    baseline: bool,
    repeat: usize,
    coordinators: Vec<usize>,
    parts: bool,
    /// Slots per claim of `--pg-parts`.
    slots: usize,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        workers: vec![1, 16, 256, 1024],
        jobs: 20_000,
        concurrency: 8,
        wake: None,
        parked: None,
        history: None,
        flow: None,
        drain: None,
        graphile: None,
        workers_given: false,
        modes: None,
        lean: false,
        baseline: true,
        repeat: 1,
        coordinators: vec![1],
        parts: false,
        slots: parts::SLOTS,
    };
    let mut it = std::env::args().skip(1).peekable();
    while let Some(flag) = it.next() {
        if flag == "--drain" {
            // The builds are optional: this build's coordinator by default.
            let builds = match it.next_if(|v| !v.starts_with("--")) {
                Some(list) => list
                    .split(',')
                    .filter(|b| !b.is_empty())
                    .map(|b| drain::System::Coordinator(drain::Build::parse(b)))
                    .collect(),
                None => vec![drain::System::Coordinator(drain::Build {
                    name: "this build".to_owned(),
                    binary: runlease_tests::process::coordinator_binary(),
                })],
            };
            args.drain = Some(builds);
            continue;
        }
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--coordinators" => {
                args.coordinators = value()?
                    .split(',')
                    .map(|k| k.trim().parse())
                    .collect::<Result<_, _>>()?;
                anyhow::ensure!(
                    args.coordinators.iter().all(|k| *k >= 1),
                    "--coordinators: at least 1 each"
                );
            }
            "--workers" => {
                args.workers_given = true;
                args.workers = value()?
                    .split(',')
                    .map(|w| w.trim().parse())
                    .collect::<Result<_, _>>()?;
            }
            "--jobs" => args.jobs = value()?.parse()?,
            "--concurrency" => args.concurrency = value()?.parse()?,
            "--batching" => {
                use throughput::Mode;
                let modes = value()?
                    .split(',')
                    .map(|m| match m.trim() {
                        "on" => Ok(vec![Mode::On]),
                        "off" => Ok(vec![Mode::Off]),
                        "per-job" => Ok(vec![Mode::PerJob]),
                        "both" => Ok(vec![Mode::Off, Mode::On]),
                        other => {
                            bail!("--batching takes on, off, per-job or both (comma-separated), not {other}")
                        }
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                args.modes = Some(modes.concat());
            }
            "--graphile" => args.graphile = Some(value()?.into()),
            "--wake" => args.wake = Some(value()?.parse()?),
            "--lean" => args.lean = true,
            "--pg-parts" => args.parts = true,
            "--slots" => args.slots = value()?.parse()?,
            "--no-baseline" => args.baseline = false,
            "--repeat" => args.repeat = value()?.parse()?,
            "--parked" => args.parked = Some(value()?.parse()?),
            "--flow" => {
                args.flow = Some(
                    value()?
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(Into::into)
                        .collect(),
                );
            }
            "--history" => {
                args.history = Some(
                    value()?
                        .split(',')
                        .map(|w| w.trim().parse())
                        .collect::<Result<_, _>>()?,
                );
            }
            "-h" | "--help" => {
                println!(
                    "runlease-bench [--lean] [--workers 1,16,256,1024] [--jobs 20000] [--concurrency 8] [--batching per-job,off,on] [--repeat N] [--no-baseline]"
                );
                println!(
                    "runlease-bench --wake 200      wake latency between two coordinators, Redis up and down"
                );
                println!(
                    "runlease-bench --parked 10000  parked long-polls on one coordinator: connections, memory"
                );
                println!(
                    "runlease-bench --drain [NAME=]BINARY,... [--graphile tests/peers/graphile-worker] [--workers 16,256] [--jobs 20000] [--concurrency 8] [--repeat 3] [--coordinators 1,3]  coordinator builds (and graphile-worker) against the PostgreSQL roofline (pgbench)"
                );
                println!(
                    "runlease-bench --history 0,1000000,10000000 [--jobs 20000]  scrape latency and drain rate as history grows; pruning"
                );
                println!(
                    "runlease-bench --pg-parts [--jobs 20000] [--slots 512] [--repeat 5]  PostgreSQL's work per job (pages, WAL, CPU) by part of the schema, claims of --slots"
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
    if let Some(older) = &args.flow {
        return flow::report(older, args.jobs, args.repeat.max(1)).await;
    }
    if let Some(mut systems) = args.drain.clone() {
        if let Some(dir) = &args.graphile {
            systems.push(drain::System::Graphile(dir.clone()));
        }
        let workers = if args.workers_given {
            args.workers.clone()
        } else {
            vec![16, 256]
        };
        return drain::report(
            &systems,
            &workers,
            args.jobs,
            args.concurrency,
            args.repeat.max(1),
            &args.coordinators,
        )
        .await;
    }
    if args.parts {
        return parts::report(args.jobs, args.slots, args.repeat.max(1)).await;
    }
    if let Some(sizes) = &args.history {
        return history::report(sizes, args.jobs).await;
    }
    let kind = if args.lean {
        throughput::WorkerKind::Lean
    } else {
        throughput::WorkerKind::Runtime
    };
    let modes = args.modes.unwrap_or_else(|| {
        use throughput::Mode;
        match kind {
            throughput::WorkerKind::Lean => vec![Mode::PerJob, Mode::Off, Mode::On],
            throughput::WorkerKind::Runtime => vec![Mode::Off, Mode::On],
        }
    });
    throughput::report(
        &args.workers,
        args.jobs,
        args.concurrency,
        &modes,
        kind,
        args.baseline,
        args.repeat,
    )
    .await
}
