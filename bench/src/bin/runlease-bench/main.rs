//! `runlease-bench`: what runlease sustains on this machine, measured, not
//! asserted. One subcommand per measurement (`runlease-bench help
//! SUBCOMMAND` lists its options):
//!
//! - `throughput` (`--workers 1,16,256,1024 --jobs 20000 --concurrency 8`):
//!   for each worker count, a coordinator in-process on a fresh database,
//!   the jobs enqueued in batches, then that many workers of the client's
//!   runtime until every job is done — once with batching off (one
//!   statement per request) and once with it on. Between runs it measures
//!   PostgreSQL alone running the same guarded statements with 100 jobs
//!   each, and prints each run as a ratio to the mean of the two
//!   measurements around it (the machine's speed drifts with its
//!   neighbours' load). Per run: jobs/s (drain; and with enqueue),
//!   claim→complete and enqueue→start p50/p99, PostgreSQL transactions per
//!   job, and CPU per job of this process (coordinator and workers) and of
//!   the rest of the machine (PostgreSQL). `--no-baseline` skips PostgreSQL
//!   alone (for profiling); `--repeat N` runs everything N times and ends
//!   with the median jobs/s and ×PG of each run. `--lean`: bare protocol
//!   workers instead of the runtime (claim up to `--concurrency`, complete
//!   them in one `/v1/finish`), with a third mode, `per-job`: batching off
//!   and one `/v1/complete` per lease.
//! - `wake N`: wake latency between two coordinators (enqueue on A → parked
//!   claim answered on B), with Redis and with Redis stopped.
//! - `parked N`: N long-poll claims parked on one coordinator process: its
//!   PostgreSQL connections and resident memory; each claim on an HTTP/1.1
//!   connection of its own, or with `--http2` as streams of shared HTTP/2
//!   connections.
//! - `flow OLD_BINARY[,...]`: an unlimited queue drained by older builds and
//!   by this one (interleaved, `--repeat` rounds), and a queue with
//!   `max_running = 100`, each build over a database it migrated itself.
//! - `drain [[NAME=]BINARY[,...]]` (default: this build's coordinator beside
//!   the bench binary): each build as its own process on a fresh database,
//!   outside HTTP workers (`--workers`, default 16,256) draining `--jobs`
//!   preloaded jobs, in the same run as a PostgreSQL roofline (pgbench, a
//!   plain table, claim 100 with `FOR UPDATE SKIP LOCKED` and a guarded
//!   complete of 100, 16 clients); drain jobs/s, × roofline, PostgreSQL
//!   transactions, WAL bytes and CPU per job, coordinator CPU, HTTP requests
//!   per job, claim→complete and enqueue→start p50/p99; medians of
//!   `--repeat` interleaved rounds. `--graphile bench/peers/graphile-worker`
//!   (`npm ci` runs there first if needed) adds graphile-worker 0.17 in its batched mode,
//!   measured the same way. `--coordinators 1,3` runs each build as that
//!   many processes over one database, the workers spread over them (the
//!   scale-out figures). `--push` adds a push drain of each build in the
//!   same run: its queue served by an endpoint in this process, answering
//!   200 at once, with as many requests in flight as the most workers; push
//!   jobs/s (× the first build's pull drain at those workers), PostgreSQL
//!   transactions per job, and enqueue→request p50/p99 at 500 jobs/s
//!   offered. See `drain.rs`,
//!   `push.rs` and `roofline.rs`.
//! - `compare [[NAME=]BINARY[,...]]`: drains of `--jobs 20000,100000` at
//!   `--workers 16,256` for each build, graphile-worker 0.17 and both
//!   pgbench rooflines (the finite backlog of `drain`, and the steady loop:
//!   insert 100, claim 100, complete 100, 16 clients), as round-by-round
//!   ratios with the targets (≥ 1.0× graphile-worker at 256 workers, ≥ 0.6×
//!   the steady roofline at 16). See `compare.rs`.
//! - `open-loop [[NAME=]BINARY[,...]]`: one `POST /v1/jobs` per job at a
//!   fixed offered rate (`--rates 1000,5000,10000`, `--seconds 60`) over a
//!   keep-alive pool, outside workers running them; enqueue→ack, →start and
//!   →done p50/p99/max and the share acknowledged, and graphile-worker's
//!   `addJob` at the same rates, with the targets. See `openloop.rs`.
//! - `enqueue [[NAME=]BINARY[,...]]`: `POST /v1/jobs/batch` of 1,000 against
//!   graphile-worker's `addJobs` of 1,000 (target ≥ 1.0×). See `enqueue.rs`.
//! - `graph [[NAME=]BINARY]`: a fan-out/fan-in of `--jobs` (10,000)
//!   dependent jobs (one root, leaves, `--fan-in` merges, one final job)
//!   drained by `--workers` (256) outside HTTP workers, against a plain
//!   drain of as many independent jobs in the same round; jobs/s of each
//!   and the ratio (target ≥ 0.7×). See `graph.rs`.
//! - `pg-parts`: PostgreSQL's work per job (shared buffers, WAL, the
//!   backend's CPU) with the coordinator's claim and finish statements on one
//!   connection, on the schema as migrated and on variants each without one
//!   of its parts (an index, the checks, the primary key's uniqueness) or
//!   with ended jobs moved to a history table: what each part costs;
//!   `--slots N` sets the claims' size (default 512, a claim at 256
//!   workers; 64 is about a batch at 16 workers). See `parts.rs`.
//! - `history 0,1000000,10000000`: `/metrics` and `/v1/queues` latency and
//!   the drain rate of `--jobs` fresh jobs as terminal history grows, then
//!   pruning: its rate over that history, and beside a sustained drain.
//! - `churn`: `/metrics` and `/v1/queues` latency (p50/p99/max per 10 s)
//!   for a minute after a burst of `--jobs` (300,000) drained by outside
//!   workers, and during a steady stream at half its drain rate; then the
//!   drain rate with the xmin horizon pinned (`--pin-minutes`) against it
//!   unpinned. See `churn.rs`.
//! - `sdk`: the worker libraries (TypeScript under Node.js, Python blocking
//!   and asyncio) against the Rust client: jobs/s of one no-op pull worker
//!   with `--concurrency` (64) handlers draining `--jobs` preloaded jobs from
//!   one coordinator, and each as a ratio of the Rust client's in the same
//!   round. Needs `sdk/typescript/dist` built and a Python with the library
//!   (`bash scripts/sdk-python-venv.sh`). See `sdk.rs`.
//!
//! ```sh
//! cargo build --release -p runlease-coordinator -p runlease-bench --bin runlease-coordinator --bin runlease-bench
//! target/release/runlease-bench throughput
//! target/release/runlease-bench throughput --lean
//! target/release/runlease-bench wake 200
//! target/release/runlease-bench parked 10000
//! target/release/runlease-bench parked 10000 --http2
//! target/release/runlease-bench history 0,1000000,10000000
//! target/release/runlease-bench churn --pin-minutes 10
//! target/release/runlease-bench pg-parts --repeat 5
//! target/release/runlease-bench sdk --jobs 5000 --repeat 3
//! target/release/runlease-bench compare --repeat 3
//! target/release/runlease-bench open-loop --rates 1000,5000,10000 --seconds 60
//! target/release/runlease-bench enqueue --repeat 3
//! target/release/runlease-bench graph --repeat 3
//! target/release/runlease-bench drain old=../old/runlease-coordinator,new=target/release/runlease-coordinator --repeat 3
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod args;
mod churn;
mod compare;
mod drain;
mod enqueue;
mod flow;
mod graph;
mod graphile;
mod h1;
mod history;
mod openloop;
mod parked;
mod parts;
mod push;
mod raw;
mod roofline;
mod sdk;
mod stats;
mod throughput;
mod wake;

use std::path::PathBuf;

use clap::builder::RangedU64ValueParser;
use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::args::{CompareArgs, EnqueueArgs, GraphArgs, OpenLoopArgs, builds};

/// The coordinator binary's allocator, so the in-process coordinator is
/// measured as it runs.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What runlease sustains on this machine, measured against the PostgreSQL
/// on 127.0.0.1:5432 (the tests' harness: a fresh database per run).
#[derive(Parser)]
#[command(name = "runlease-bench")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// In-process coordinator and workers: jobs/s with batching off and on,
    /// as a ratio to PostgreSQL alone running the same statements.
    Throughput(ThroughputArgs),
    /// Wake latency between two coordinators, Redis up and down.
    Wake {
        /// Jobs enqueued on one coordinator while a claim waits on the other.
        #[arg(default_value_t = 200)]
        rounds: usize,
    },
    /// Parked long-poll claims on one coordinator: its connections and memory.
    Parked {
        /// Claims to park.
        #[arg(default_value_t = 10_000)]
        claims: usize,
        /// Park them as HTTP/2 streams (prior knowledge), as many on one
        /// connection as the coordinator allows (100), as a proxy that
        /// multiplexes its clients' requests would, instead of one
        /// HTTP/1.1 connection each.
        #[arg(long)]
        http2: bool,
    },
    /// What flow control costs: older builds and this one, an unlimited queue
    /// and one with `max_running = 100`.
    Flow(FlowArgs),
    /// Coordinator builds (and graphile-worker) draining a preloaded queue,
    /// against the PostgreSQL roofline (pgbench).
    Drain(DrainArgs),
    /// Drains of 20,000 and 100,000 jobs at 16 and 256 workers: builds,
    /// graphile-worker and the finite and steady rooflines, as ratios, with
    /// the targets.
    Compare(CompareArgs),
    /// Jobs offered one enqueue at a time at fixed rates: enqueue→start and
    /// →done latencies and the share acknowledged, beside graphile-worker.
    OpenLoop(OpenLoopArgs),
    /// Batch enqueue (1,000 per request) against graphile-worker's addJobs.
    Enqueue(EnqueueArgs),
    /// A fan-out/fan-in of dependent jobs against a plain drain of as many.
    Graph(GraphArgs),
    /// PostgreSQL's work per job (pages, WAL, CPU) by part of the schema.
    PgParts(PgPartsArgs),
    /// Scrape latency and drain rate as terminal history grows; pruning.
    History(HistoryArgs),
    /// Scrape latency after a burst and during a steady stream; the drain
    /// with the xmin horizon pinned.
    Churn(ChurnArgs),
    /// The TypeScript and Python worker libraries against the Rust client:
    /// jobs/s of a no-op pull worker, and its ratio to the Rust client's.
    Sdk(SdkArgs),
}

/// A count of at least one (`--repeat`, `--coordinators`, `--slots`).
fn at_least_one() -> RangedU64ValueParser<usize> {
    RangedU64ValueParser::new().range(1..)
}

#[derive(Args)]
struct ThroughputArgs {
    /// Worker counts, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256,1024")]
    workers: Vec<usize>,
    /// Jobs per run.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Jobs each worker runs at once (the most it claims).
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Bare protocol workers (claim, one `/v1/finish`) instead of the runtime.
    #[arg(long)]
    lean: bool,
    /// Batching modes to run, in order (default: off,on; with `--lean`:
    /// per-job,off,on).
    #[arg(long, value_delimiter = ',')]
    batching: Vec<Batching>,
    /// Runs of everything; past one, ends with the medians.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    repeat: usize,
    /// Skip PostgreSQL alone between runs (for profiling).
    #[arg(long)]
    no_baseline: bool,
}

/// A `--batching` value.
#[derive(Clone, Copy, ValueEnum)]
enum Batching {
    /// Batching off, each lease completed by its own `/v1/complete` (`--lean`).
    PerJob,
    /// Batching off.
    Off,
    /// Batching on.
    On,
    /// off, then on.
    Both,
}

impl Batching {
    fn modes(self) -> &'static [throughput::Mode] {
        use throughput::Mode;
        match self {
            Batching::PerJob => &[Mode::PerJob],
            Batching::Off => &[Mode::Off],
            Batching::On => &[Mode::On],
            Batching::Both => &[Mode::Off, Mode::On],
        }
    }
}

#[derive(Args)]
struct FlowArgs {
    /// Older `runlease-coordinator` binaries, beside this build's.
    #[arg(value_name = "OLD_BINARY", value_delimiter = ',', required = true)]
    older: Vec<PathBuf>,
    /// Jobs per drain.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Interleaved rounds.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    repeat: usize,
}

#[derive(Args)]
struct DrainArgs {
    /// `[NAME=]BINARY` of each coordinator build (default: this build's,
    /// beside the bench binary).
    #[arg(value_name = "[NAME=]BINARY", value_delimiter = ',')]
    builds: Vec<String>,
    /// Also graphile-worker, from this directory (`npm ci` runs there first
    /// if its `node_modules` is missing; the peer is `bench/peers/graphile-worker`).
    #[arg(long, value_name = "DIR")]
    graphile: Option<PathBuf>,
    /// HTTP worker counts, one run each.
    #[arg(long, value_delimiter = ',', default_value = "16,256")]
    workers: Vec<usize>,
    /// Preloaded jobs per run.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Leases each worker claims and finishes at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Interleaved rounds; the table is their medians.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    repeat: usize,
    /// Processes per build over one database, the workers spread over them.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = at_least_one())]
    coordinators: Vec<usize>,
    /// Also a push drain of each build: the queue served by an endpoint in
    /// this process (as many requests in flight as the most workers),
    /// then enqueue→request latency at 500 jobs/s offered (see `push.rs`).
    #[arg(long)]
    push: bool,
    /// Seconds of the push latency phase (500 jobs/s offered).
    #[arg(long, default_value_t = 10, value_parser = RangedU64ValueParser::<u64>::new().range(1..=600))]
    push_latency_s: u64,
}

#[derive(Args)]
struct PgPartsArgs {
    /// Jobs per variant.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Slots per claim (64 is about a batch at 16 workers).
    #[arg(long, default_value_t = parts::SLOTS, value_parser = at_least_one())]
    slots: usize,
    /// Rounds; the table is their medians.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    repeat: usize,
}

#[derive(Args)]
struct HistoryArgs {
    /// Terminal jobs of history to measure at, in increasing order.
    #[arg(value_name = "SIZES", value_delimiter = ',', required = true)]
    sizes: Vec<usize>,
    /// Fresh jobs drained at each size.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
}

#[derive(Args)]
struct ChurnArgs {
    /// Jobs of the burst.
    #[arg(long, default_value_t = 300_000, value_parser = at_least_one())]
    jobs: usize,
    /// Outside HTTP workers.
    #[arg(long, default_value_t = 256, value_parser = at_least_one())]
    workers: usize,
    /// Seconds of sampling after the burst, and of the steady stream.
    #[arg(long, default_value_t = 60, value_parser = RangedU64ValueParser::<u64>::new().range(10..=3600))]
    sample_s: u64,
    /// Jobs per drain with the horizon pinned (and without).
    #[arg(long, default_value_t = 100_000, value_parser = at_least_one())]
    pin_jobs: usize,
    /// Minutes the horizon stays pinned, drains running meanwhile.
    #[arg(long, default_value_t = 10.0)]
    pin_minutes: f64,
    /// The coordinator binary (default: this build's, beside the bench binary).
    #[arg(long)]
    binary: Option<PathBuf>,
}

#[derive(Args)]
struct SdkArgs {
    /// Preloaded jobs per run.
    #[arg(long, default_value_t = 5_000, value_parser = at_least_one())]
    jobs: usize,
    /// Handlers each worker runs at once.
    #[arg(long, default_value_t = 64, value_parser = at_least_one())]
    concurrency: usize,
    /// Interleaved rounds; the table ends with their medians.
    #[arg(long, default_value_t = 1, value_parser = at_least_one())]
    repeat: usize,
    /// Node.js (default: `node` on PATH).
    #[arg(long)]
    node: Option<PathBuf>,
    /// A Python with the `runlease` package (default: the tests'
    /// environment, `target/sdk-python-venv/bin/python`).
    #[arg(long)]
    python: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Throughput(a) => {
            let kind = if a.lean {
                throughput::WorkerKind::Lean
            } else {
                throughput::WorkerKind::Runtime
            };
            let modes: Vec<_> = if a.batching.is_empty() {
                use throughput::Mode;
                match kind {
                    throughput::WorkerKind::Lean => vec![Mode::PerJob, Mode::Off, Mode::On],
                    throughput::WorkerKind::Runtime => vec![Mode::Off, Mode::On],
                }
            } else {
                a.batching.iter().flat_map(|b| b.modes()).copied().collect()
            };
            throughput::report(
                &a.workers,
                a.jobs,
                a.concurrency,
                &modes,
                kind,
                !a.no_baseline,
                a.repeat,
            )
            .await
        }
        Command::Wake { rounds } => wake::report(rounds).await,
        Command::Parked { claims, http2 } => parked::report(claims, http2).await,
        Command::Flow(a) => flow::report(&a.older, a.jobs, a.repeat).await,
        Command::Drain(a) => {
            let mut systems: Vec<_> = builds(&a.builds)
                .into_iter()
                .map(drain::System::Coordinator)
                .collect();
            if let Some(dir) = a.graphile {
                graphile::ensure_installed(&dir).await?;
                systems.push(drain::System::Graphile(dir));
            }
            let pull = drain::report(
                &systems,
                &a.workers,
                a.jobs,
                a.concurrency,
                a.repeat,
                &a.coordinators,
            )
            .await?;
            if a.push {
                let builds: Vec<&drain::Build> = systems
                    .iter()
                    .filter_map(|s| match s {
                        drain::System::Coordinator(b) => Some(b),
                        drain::System::Graphile(_) => None,
                    })
                    .collect();
                anyhow::ensure!(!builds.is_empty(), "--push drains a coordinator build: name one");
                let in_flight = a.workers.iter().copied().max().unwrap_or(256);
                for build in builds {
                    let p = push::run(&build.binary, a.jobs, in_flight, a.push_latency_s).await?;
                    println!(
                        "\npush drain ({}, {} preloaded jobs, endpoint concurrency {in_flight}, an endpoint answering 200 at once): {:.0} jobs/s{}, {:.3} PG xacts/job; enqueue→request at 500 jobs/s offered ({} jobs): p50 {:.1} ms, p99 {:.1} ms",
                        build.name,
                        a.jobs,
                        p.jobs_per_s,
                        pull.map_or_else(String::new, |pull| format!(
                            " (×{:.2} the first build's pull drain at {in_flight} workers, {pull:.0} jobs/s)",
                            p.jobs_per_s / pull
                        )),
                        p.xacts,
                        p.offered,
                        p.latency.0,
                        p.latency.1
                    );
                }
            }
            Ok(())
        }
        Command::Compare(a) => {
            let dir = a.peer.dir();
            compare::report(
                &builds(&a.builds),
                dir.as_deref(),
                &a.jobs,
                &a.workers,
                a.concurrency,
                a.repeat,
            )
            .await
        }
        Command::OpenLoop(a) => {
            let dir = a.peer.dir();
            let offer = openloop::Offer {
                rate: 0,
                seconds: a.seconds,
                workers: a.workers,
                concurrency: u32::try_from(a.concurrency)?,
                connections: 0,
                graphile_connections: a.graphile_connections,
                grace: std::time::Duration::from_secs(a.grace_s),
            };
            openloop::report(
                &builds(&a.builds),
                dir.as_deref(),
                &a.rates,
                a.connections,
                a.repeat,
                offer,
            )
            .await
        }
        Command::Enqueue(a) => {
            let dir = a.peer.dir();
            enqueue::report(&builds(&a.builds), dir.as_deref(), a.jobs, a.repeat).await
        }
        Command::Graph(a) => {
            let build = builds(a.build.as_slice()).remove(0);
            graph::run(&build, a.workers, a.jobs, a.fan_in, a.concurrency, a.repeat).await
        }
        Command::PgParts(a) => parts::report(a.jobs, a.slots, a.repeat).await,
        Command::History(a) => history::report(&a.sizes, a.jobs).await,
        Command::Churn(a) => {
            churn::report(churn::Options {
                jobs: a.jobs,
                workers: a.workers,
                sample_s: a.sample_s,
                pin_jobs: a.pin_jobs,
                pin_minutes: a.pin_minutes,
                binary: a
                    .binary
                    .unwrap_or_else(runlease_tests::process::coordinator_binary),
            })
            .await
        }
        Command::Sdk(a) => {
            sdk::report(a.jobs, a.concurrency, a.repeat, sdk::Tools::new(a.node, a.python)).await
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
    fn a_drain_takes_named_builds_and_the_old_options() {
        let cli = Cli::try_parse_from([
            "runlease-bench",
            "drain",
            "old=a/runlease-coordinator,new=b/runlease-coordinator",
            "--workers",
            "16,256",
            "--repeat",
            "3",
            "--coordinators",
            "1,3",
        ])
        .unwrap();
        let Command::Drain(a) = cli.command else {
            panic!("not a drain");
        };
        assert_eq!(a.builds.len(), 2);
        assert_eq!(a.workers, [16, 256]);
        assert_eq!((a.repeat, a.coordinators), (3, vec![1, 3]));
    }

    #[test]
    fn lists_default_as_before() {
        let cli = Cli::try_parse_from(["runlease-bench", "drain"]).unwrap();
        let Command::Drain(a) = cli.command else {
            panic!("not a drain");
        };
        assert!(a.builds.is_empty());
        assert_eq!((a.workers, a.coordinators), (vec![16, 256], vec![1]));
        let cli = Cli::try_parse_from(["runlease-bench", "throughput"]).unwrap();
        let Command::Throughput(a) = cli.command else {
            panic!("not a throughput run");
        };
        assert_eq!(a.workers, [1, 16, 256, 1024]);
    }

    #[test]
    fn the_comparisons_default_to_the_issue_shapes() {
        let cli = Cli::try_parse_from(["runlease-bench", "compare", "a=x/c,b=y/c"]).unwrap();
        let Command::Compare(a) = cli.command else {
            panic!("not a comparison");
        };
        assert_eq!(
            (a.jobs, a.workers, a.repeat),
            (vec![20_000, 100_000], vec![16, 256], 3)
        );
        assert_eq!(builds(&a.builds).len(), 2);
        assert!(a.peer.dir().is_some_and(|d| d.ends_with("peers/graphile-worker")));
        let cli = Cli::try_parse_from(["runlease-bench", "open-loop", "--no-graphile"]).unwrap();
        let Command::OpenLoop(a) = cli.command else {
            panic!("not an open loop");
        };
        assert_eq!((a.rates, a.seconds), (vec![1_000, 5_000, 10_000], 60));
        assert!(a.peer.dir().is_none());
        assert_eq!(builds(&a.builds)[0].name, "this build");
        assert!(
            Cli::try_parse_from(["runlease-bench", "enqueue", "--graphile", "d", "--no-graphile"]).is_err(),
            "a peer directory and no peer"
        );
    }

    #[test]
    fn repeat_and_coordinators_are_at_least_one() {
        for args in [
            ["runlease-bench", "pg-parts", "--repeat", "0"],
            ["runlease-bench", "drain", "--coordinators", "0"],
            ["runlease-bench", "pg-parts", "--slots", "0"],
        ] {
            assert!(Cli::try_parse_from(args).is_err(), "{args:?}");
        }
    }
}
