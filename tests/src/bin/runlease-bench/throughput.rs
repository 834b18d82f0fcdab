//! Throughput of runlease through HTTP, batching off and on, against
//! PostgreSQL alone running the same statements.

use std::time::{Duration, Instant};

use runlease_client::protocol::producer::EnqueueJobRequest;
use runlease_client::protocol::{QueueName, WorkerId};
use runlease_client::{Client, JobContext, JobError, Worker};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::raw;
use crate::stats::{latencies, xacts};

struct Run {
    enqueue: Duration,
    drain: Duration,
    claim_to_complete: (f64, f64),
    enqueue_to_start: (f64, f64),
    xacts_per_job: f64,
}

/// How each simulated worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerKind {
    /// The client's worker runtime (a task per job, heartbeats, finishing queue).
    Runtime,
    /// A bare loop: claim up to `concurrency` leases, complete them all in one
    /// `POST /v1/finish`, repeat. The protocol's cost without the runtime's.
    Lean,
}

/// A bare worker: claim a batch, finish it in one request, until `stop`.
async fn lean_worker(
    client: Client,
    worker: WorkerId,
    queue: QueueName,
    max_jobs: u32,
    stop: CancellationToken,
) {
    use runlease_client::protocol::worker::{ClaimRequest, FinishAction, FinishItem, FinishRequest};
    while !stop.is_cancelled() {
        let req = ClaimRequest {
            queues: vec![queue.clone()],
            worker_id: worker.clone(),
            max_jobs,
            wait_ms: 500,
            time_left_ms: None,
        };
        let Ok(answer) = client.claim(&req).await else {
            continue;
        };
        if answer.leases.is_empty() {
            continue;
        }
        let items = answer
            .leases
            .into_iter()
            .map(|l| FinishItem {
                lease_token: l.lease_token,
                action: FinishAction::Complete,
                result: Some(l.payload),
                error: None,
                retryable: None,
                retry_after_ms: None,
                progress: None,
            })
            .collect();
        let _ = client.finish(&FinishRequest { items }).await;
    }
}

async fn run(
    workers: usize,
    jobs: usize,
    concurrency: usize,
    batching: bool,
    kind: WorkerKind,
) -> anyhow::Result<Run> {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.database_pool_size = 20;
        cfg.reaper_interval_ms = 5_000;
        cfg.batching = batching;
        // Only this coordinator runs: no Redis round trip on enqueue.
        cfg.redis_url = String::new();
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
    let before = xacts(&db.name).await;

    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut handles = Vec::new();
    for w in 0..workers {
        if kind == WorkerKind::Lean {
            let id = WorkerId::new(format!("bench-{w}")).unwrap();
            let max_jobs = u32::try_from(concurrency).unwrap_or(u32::MAX);
            handles.push(tokio::spawn({
                let (client, queue, stop) = (client.clone(), queue.clone(), stop.clone());
                async move {
                    lean_worker(client, id, queue, max_jobs, stop).await;
                    runlease_client::WorkerReport::default()
                }
            }));
            continue;
        }
        let worker = Worker::builder(client.clone())
            .worker_id(WorkerId::new(format!("bench-{w}")).unwrap())
            .concurrency(concurrency)
            .claim_wait(Duration::from_secs(2))
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
    let (claim_to_complete, enqueue_to_start) = latencies(&probe).await;
    c.stop().await?;
    Ok(Run {
        enqueue,
        drain,
        claim_to_complete,
        enqueue_to_start,
        xacts_per_job: (after - before) as f64 / jobs as f64,
    })
}

pub async fn report(
    workers: &[usize],
    jobs: usize,
    concurrency: usize,
    modes: &[bool],
    kind: WorkerKind,
) -> anyhow::Result<()> {
    match kind {
        WorkerKind::Runtime => println!(
            "runlease-bench: {jobs} jobs per run; each worker is the client's runtime running {concurrency} jobs at once (claims up to that many, finishes through /v1/finish)"
        ),
        WorkerKind::Lean => println!(
            "runlease-bench: {jobs} jobs per run; each worker is a bare loop: claim up to {concurrency}, complete them in one /v1/finish"
        ),
    }
    println!(
        "coordinator in-process, PostgreSQL at {}",
        runlease_tests::admin_url()
    );
    let raw = raw::run(jobs).await;
    let raw_drain = jobs as f64 / raw.drain.as_secs_f64();
    let raw_all = jobs as f64 / (raw.drain + raw.enqueue).as_secs_f64();
    println!(
        "\nPostgreSQL alone, {} jobs per statement, 4 connections: {:.0} jobs/s claim+complete, {:.0} jobs/s with enqueue",
        raw::PER_STATEMENT,
        raw_drain,
        raw_all
    );
    println!(
        "\n{:>8} {:>9} {:>10} {:>7} {:>11} {:>8} {:>11} {:>11} {:>13} {:>13} {:>9}",
        "workers",
        "batching",
        "jobs/s",
        "×PG",
        "jobs/s+enq",
        "×PG",
        "claim→done",
        "claim→done",
        "enqueue→start",
        "enqueue→start",
        "PG xacts"
    );
    println!(
        "{:>8} {:>9} {:>10} {:>7} {:>11} {:>8} {:>11} {:>11} {:>13} {:>13} {:>9}",
        "", "", "(drain)", "", "", "", "p50 ms", "p99 ms", "p50 ms", "p99 ms", "per job"
    );
    for &w in workers {
        let mut per_mode = Vec::new();
        for &batching in modes {
            let r = run(w, jobs, concurrency, batching, kind).await?;
            let n = jobs as f64;
            let drain = n / r.drain.as_secs_f64();
            let all = n / (r.drain + r.enqueue).as_secs_f64();
            println!(
                "{:>8} {:>9} {:>10.0} {:>7.2} {:>11.0} {:>8.2} {:>11.1} {:>11.1} {:>13.0} {:>13.0} {:>9.3}",
                w,
                if batching { "on" } else { "off" },
                drain,
                drain / raw_drain,
                all,
                all / raw_all,
                r.claim_to_complete.0,
                r.claim_to_complete.1,
                r.enqueue_to_start.0,
                r.enqueue_to_start.1,
                r.xacts_per_job,
            );
            per_mode.push(drain);
        }
        if per_mode.len() == 2 {
            println!("{:>8} batching on / off: {:.1}×", "", per_mode[1] / per_mode[0]);
        }
    }
    Ok(())
}
