//! `runlease-bench`: end-to-end throughput and latency of runlease on this
//! machine. For each worker count it starts a coordinator on a fresh database
//! (cloned from the migrated template, as the tests do), enqueues the jobs in
//! batches, runs that many workers of the client's worker runtime (each with
//! its own concurrency) until every job is done, and prints:
//!
//! - jobs/s with enqueue excluded (drain only) and included (enqueue + drain);
//! - claim→complete latency p50/p99 and enqueue→start latency p50/p99, from
//!   the attempt chronology (PostgreSQL's clock);
//! - PostgreSQL transactions per job (`pg_stat_database` of the run's database).
//!
//! With `--wake N` it measures instead the wake latency between two
//! coordinators (enqueue on A → parked claim answered on B), first with
//! Redis, then with Redis stopped (the timer fallback).
//!
//! `cargo run -p runlease-tests --bin runlease-bench -- --workers 1,16,256 --jobs 5000`
//! `cargo run -p runlease-tests --bin runlease-bench -- --wake 200`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use runlease_client::protocol::QueueName;
use runlease_client::protocol::producer::EnqueueJobRequest;
use runlease_client::{Client, JobContext, JobError, Worker};
use runlease_tests::{TestCoordinator, TestDb, TestRedis, admin};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Args {
    workers: Vec<usize>,
    jobs: usize,
    concurrency: usize,
    wake: Option<usize>,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        workers: vec![1, 16, 256],
        jobs: 5000,
        concurrency: 1,
        wake: None,
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
            "--wake" => args.wake = Some(value()?.parse()?),
            "-h" | "--help" => {
                println!("runlease-bench [--workers 1,16,256] [--jobs 5000] [--concurrency 1]");
                println!(
                    "runlease-bench --wake 200   (wake latency between two coordinators, Redis up and down)"
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other}; see --help"),
        }
    }
    Ok(args)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

async fn xacts(db: &str) -> i64 {
    let admin = admin().await;
    // Backends flush their counters at most once a second.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    admin
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    admin
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
            &[&db],
        )
        .await
        .unwrap()
        .get(0)
}

struct RunResult {
    workers: usize,
    enqueue: Duration,
    drain: Duration,
    claim_to_complete: (f64, f64),
    enqueue_to_start: (f64, f64),
    xacts_per_job: f64,
}

async fn run(workers: usize, jobs: usize, concurrency: usize) -> anyhow::Result<RunResult> {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.database_pool_size = 20;
        cfg.reaper_interval_ms = 5_000;
    })
    .await;
    let client = Client::new(c.api.base())?;
    let queue = QueueName::new("bench").unwrap();

    let started = Instant::now();
    let mut batch = Vec::with_capacity(1000);
    for i in 0..jobs {
        batch.push(EnqueueJobRequest::new(queue.clone(), json!(i)));
        if batch.len() == 1000 || i + 1 == jobs {
            client.enqueue_batch(std::mem::take(&mut batch)).await?;
        }
    }
    let enqueue = started.elapsed();
    let before_drain = xacts(&db.name).await;

    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut handles = Vec::new();
    for w in 0..workers {
        let worker = Worker::builder(client.clone())
            .worker_id(runlease_client::protocol::WorkerId::new(format!("bench-{w}")).unwrap())
            .concurrency(concurrency)
            .claim_wait(Duration::from_millis(500))
            .handle(queue.clone(), |ctx: JobContext| async move {
                Ok::<_, JobError>(ctx.raw_payload().clone())
            })
            .build()?;
        handles.push(tokio::spawn(worker.run(stop.clone())));
    }
    let probe = db.client().await;
    let mut probes = 0i64;
    loop {
        probes += 1;
        let done: i64 = probe
            .query_one("SELECT count(*) FROM jobs WHERE state = 'done'", &[])
            .await?
            .get(0);
        if done as usize >= jobs {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain = started.elapsed();
    stop.cancel();
    for h in handles {
        h.await?;
    }
    // The bench's own progress probes ran in this database: one transaction each.
    let after = xacts(&db.name).await - probes;
    let rows = probe
        .query(
            "SELECT (extract(epoch FROM a.finished_at - a.claimed_at) * 1000)::float8,
                    (extract(epoch FROM a.claimed_at - j.created_at) * 1000)::float8
             FROM job_attempts a JOIN jobs j ON j.id = a.job_id",
            &[],
        )
        .await?;
    let mut c2c: Vec<f64> = rows.iter().map(|r| r.get::<_, f64>(0)).collect();
    let mut e2s: Vec<f64> = rows.iter().map(|r| r.get::<_, f64>(1)).collect();
    c2c.sort_by(f64::total_cmp);
    e2s.sort_by(f64::total_cmp);
    let result = RunResult {
        workers,
        enqueue,
        drain,
        claim_to_complete: (percentile(&c2c, 0.5), percentile(&c2c, 0.99)),
        enqueue_to_start: (percentile(&e2s, 0.5), percentile(&e2s, 0.99)),
        xacts_per_job: (after - before_drain) as f64 / jobs as f64,
    };
    c.stop().await?;
    Ok(result)
}

/// Wake latency: a claim parked on coordinator B, a job enqueued through
/// coordinator A; the time from sending the enqueue to B's claim answer.
async fn wake_latency(rounds: usize, redis: &TestRedis, db: &TestDb) -> anyhow::Result<(f64, f64)> {
    let url = redis.url();
    let start = |url: String| {
        TestCoordinator::start_with(db, move |cfg| {
            cfg.redis_url = url;
        })
    };
    let a = start(url.clone()).await;
    let b = start(url).await;
    // Let both subscriptions come up (when Redis is up at all).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let api_b = b.api.clone();
        let parked = tokio::spawn(async move {
            let leases = api_b.claim_wait("wake", "bench-b", 1, 10_000).await;
            (leases, Instant::now())
        });
        // Give the claim time to park (its first look finds nothing).
        tokio::time::sleep(Duration::from_millis(30)).await;
        let sent = Instant::now();
        a.api.enqueue("wake", json!(i)).await;
        let (leases, answered) = parked.await?;
        if leases.is_empty() {
            bail!("round {i}: the parked claim answered empty");
        }
        b.api.complete(&leases[0], json!(null)).await;
        samples.push(answered.duration_since(sent).as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    a.stop().await?;
    b.stop().await?;
    Ok((percentile(&samples, 0.5), percentile(&samples, 0.99)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    if let Some(rounds) = args.wake {
        let mut redis = TestRedis::start().await;
        let db = TestDb::new().await;
        let (p50, p99) = wake_latency(rounds, &redis, &db).await?;
        println!("wake latency, enqueue on A → claim answer on B, {rounds} rounds");
        println!("  with Redis:             p50 {p50:>8.1} ms   p99 {p99:>8.1} ms");
        redis.stop();
        let (p50, p99) = wake_latency(rounds, &redis, &db).await?;
        println!(
            "  Redis stopped (timer):  p50 {p50:>8.1} ms   p99 {p99:>8.1} ms   (RUNLEASE_CLAIM_RECHECK_MS 1000, jittered)"
        );
        return Ok(());
    }
    println!(
        "runlease-bench: {} jobs per run, worker concurrency {}, coordinator in-process, PostgreSQL at {}",
        args.jobs,
        args.concurrency,
        runlease_tests::admin_url()
    );
    println!(
        "{:>8} {:>12} {:>12} {:>14} {:>14} {:>16} {:>16} {:>10}",
        "workers",
        "jobs/s",
        "jobs/s",
        "claim→done",
        "claim→done",
        "enqueue→start",
        "enqueue→start",
        "PG xacts"
    );
    println!(
        "{:>8} {:>12} {:>12} {:>14} {:>14} {:>16} {:>16} {:>10}",
        "", "(drain)", "(+enqueue)", "p50 ms", "p99 ms", "p50 ms", "p99 ms", "per job"
    );
    for &w in &args.workers {
        let r = run(w, args.jobs, args.concurrency).await?;
        let n = args.jobs as f64;
        println!(
            "{:>8} {:>12.0} {:>12.0} {:>14.1} {:>14.1} {:>16.0} {:>16.0} {:>10.2}",
            r.workers,
            n / r.drain.as_secs_f64(),
            n / (r.drain + r.enqueue).as_secs_f64(),
            r.claim_to_complete.0,
            r.claim_to_complete.1,
            r.enqueue_to_start.0,
            r.enqueue_to_start.1,
            r.xacts_per_job,
        );
    }
    Ok(())
}
