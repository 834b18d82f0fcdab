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
use crate::stats::{Cpu, latencies, xacts};

struct Run {
    enqueue: Duration,
    drain: Duration,
    claim_to_complete: (f64, f64),
    enqueue_to_start: (f64, f64),
    xacts_per_job: f64,
    /// CPU µs per job during the drain: this process (coordinator and
    /// workers), and the rest of the machine (PostgreSQL).
    cpu: (f64, f64),
    /// Worker requests (claim, heartbeat, complete, finish) per job.
    requests_per_job: f64,
}

/// Worker requests the coordinator answered, from its `/metrics`.
async fn worker_requests(base: &str) -> anyhow::Result<f64> {
    let text = reqwest::get(format!("{base}/metrics")).await?.text().await?;
    let worker_routes = [
        "\"/v1/claim\"",
        "\"/v1/heartbeat\"",
        "\"/v1/complete\"",
        "\"/v1/finish\"",
    ];
    Ok(text
        .lines()
        .filter(|l| l.starts_with("runlease_request_duration_seconds_count"))
        .filter(|l| worker_routes.iter().any(|r| l.contains(r)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
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

/// A bare worker: claim a batch, finish it, until `stop`. With `per_job`
/// each lease is completed by its own `POST /v1/complete` (all at once): the
/// protocol as it was before `/v1/finish`.
pub(crate) async fn lean_worker(
    client: Client,
    worker: WorkerId,
    queue: QueueName,
    max_jobs: u32,
    per_job: bool,
    stop: CancellationToken,
) {
    use runlease_client::protocol::worker::{
        ClaimRequest, CompleteRequest, FinishAction, FinishItem, FinishRequest,
    };
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
        if per_job {
            let mut each = tokio::task::JoinSet::new();
            for l in answer.leases {
                let client = client.clone();
                each.spawn(async move {
                    let req = CompleteRequest {
                        lease_token: l.lease_token,
                        result: l.payload,
                    };
                    let _ = client.complete(&req).await;
                });
            }
            each.join_all().await;
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
        let _ = client.finish(&FinishRequest { items, claim: None }).await;
    }
}

async fn run(
    workers: usize,
    jobs: usize,
    concurrency: usize,
    mode: Mode,
    kind: WorkerKind,
) -> anyhow::Result<Run> {
    let batching = mode == Mode::On;
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.database.pool_size = 20;
        cfg.leases.reaper_interval = std::time::Duration::from_millis(5_000);
        cfg.batching.enabled = batching;
        // PostgreSQL alone talks to the server without TLS; so does the
        // coordinator here (its default, `prefer`, encrypts when it can).
        let sep = if cfg.database.url.contains('?') { '&' } else { '?' };
        cfg.database.url = format!("{}{sep}sslmode=disable", cfg.database.url);
        // Only this coordinator runs: no Redis round trip on enqueue.
        cfg.redis.url = String::new();
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
    let cpu = Cpu::now();
    let started = Instant::now();
    let mut handles = Vec::new();
    for w in 0..workers {
        if kind == WorkerKind::Lean {
            let id = WorkerId::new(format!("bench-{w}")).unwrap();
            let max_jobs = u32::try_from(concurrency).unwrap_or(u32::MAX);
            handles.push(tokio::spawn({
                let (client, queue, stop) = (client.clone(), queue.clone(), stop.clone());
                async move {
                    lean_worker(client, id, queue, max_jobs, mode == Mode::PerJob, stop).await;
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
    // Drained once nothing is claimable or running: two probes of the
    // partial indexes every 20 ms (not a count of the table, and not the
    // coordinator's /metrics, whose queue depths count it: either would cost
    // PostgreSQL about as much as the run itself).
    let probe = db.client().await;
    let mut probes = 0i64;
    loop {
        probes += 1;
        let busy: bool = probe
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM jobs WHERE state IN ('queued', 'enqueue_failed') AND queue = 'bench')
                     OR EXISTS (SELECT 1 FROM jobs WHERE state = 'running')",
                &[],
            )
            .await?
            .get(0);
        if !busy {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain = started.elapsed();
    let cpu = Cpu::now().per_job_since(cpu, jobs);
    probes += 1;
    let done: i64 = probe
        .query_one("SELECT count(*) FROM jobs WHERE state = 'done'", &[])
        .await?
        .get(0);
    anyhow::ensure!(
        done as usize == jobs,
        "{done} of {jobs} jobs done after the drain"
    );
    stop.cancel();
    for h in handles {
        h.await?;
    }
    // The bench's own probes ran in this database: one transaction each.
    let after = xacts(&db.name).await - probes;
    let (claim_to_complete, enqueue_to_start) = latencies(&probe).await;
    let requests = worker_requests(c.api.base()).await?;
    c.stop().await?;
    Ok(Run {
        enqueue,
        drain,
        claim_to_complete,
        enqueue_to_start,
        xacts_per_job: (after - before) as f64 / jobs as f64,
        cpu,
        requests_per_job: requests / jobs as f64,
    })
}

/// A run's place in the table: (workers, mode).
type RunKey = (usize, Mode);
/// A run's (jobs/s, ×PG).
type Measured = (f64, f64);

/// What one run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Batching off, and bare workers complete each lease with its own
    /// `POST /v1/complete`: one request, one transaction per outcome.
    PerJob,
    /// Batching off: each request is its own statements and transaction.
    Off,
    /// Batching on.
    On,
}

impl Mode {
    fn label(self) -> &'static str {
        match self {
            Mode::PerJob => "per-job",
            Mode::Off => "off",
            Mode::On => "on",
        }
    }
}

/// PostgreSQL alone, printed (NaN when `skip`).
async fn baseline(jobs: usize, skip: bool) -> (f64, f64) {
    if skip {
        return (f64::NAN, f64::NAN);
    }
    let raw = raw::run(jobs).await;
    let n = jobs as f64;
    let drain = n / raw.drain.as_secs_f64();
    let all = n / (raw.drain + raw.enqueue).as_secs_f64();
    println!(
        "{:>8} {:>9} {:>10.0} {:>7} {:>11.0} {:>8} {:>11} {:>11} {:>13} {:>13} {:>9.3} {:>9.0} {:>9.0}",
        "",
        "PG alone",
        drain,
        "",
        all,
        "",
        "",
        "",
        "",
        "",
        2.0 / raw::PER_STATEMENT as f64,
        raw.cpu.0,
        raw.cpu.1,
    );
    (drain, all)
}

pub async fn report(
    workers: &[usize],
    jobs: usize,
    concurrency: usize,
    modes: &[Mode],
    kind: WorkerKind,
    with_baseline: bool,
    repeat: usize,
) -> anyhow::Result<()> {
    match kind {
        WorkerKind::Runtime => println!(
            "runlease-bench: {jobs} jobs per run; each worker is the client's runtime running {concurrency} jobs at once (claims up to that many, finishes through /v1/finish)"
        ),
        WorkerKind::Lean => println!(
            "runlease-bench: {jobs} jobs per run; each worker is a bare loop: claim up to {concurrency}, complete them in one /v1/finish (per-job: one /v1/complete each)"
        ),
    }
    println!(
        "coordinator and workers in this process, PostgreSQL at {}",
        runlease_tests::admin_url()
    );
    println!(
        "PG alone: the same claim and complete statements from tokio-postgres, {} jobs each, 4 connections; it runs before and after every run, and ×PG is the run against the mean of the two around it",
        raw::PER_STATEMENT
    );
    println!(
        "CPU µs/job: CPU time during the drain per job, of this process (coordinator and workers; for PG alone, its client) and of the rest of the machine (PostgreSQL); HTTP req/job: claim, heartbeat, complete and finish requests per job"
    );
    println!(
        "\n{:>8} {:>9} {:>10} {:>7} {:>11} {:>8} {:>11} {:>11} {:>13} {:>13} {:>9} {:>9} {:>9} {:>8}",
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
        "PG xacts",
        "CPU µs",
        "CPU µs",
        "HTTP req"
    );
    println!(
        "{:>8} {:>9} {:>10} {:>7} {:>11} {:>8} {:>11} {:>11} {:>13} {:>13} {:>9} {:>9} {:>9} {:>8}",
        "",
        "",
        "(drain)",
        "",
        "",
        "",
        "p50 ms",
        "p99 ms",
        "p50 ms",
        "p99 ms",
        "per job",
        "this",
        "PG",
        "per job"
    );
    let mut before = baseline(jobs, !with_baseline).await;
    let mut rounds: Vec<(RunKey, Vec<Measured>)> = Vec::new();
    for round in 0..repeat.max(1) {
        if repeat > 1 {
            println!("round {} of {repeat}", round + 1);
        }
        for &w in workers {
            let mut per_mode = Vec::new();
            for &mode in modes {
                if mode == Mode::PerJob && kind == WorkerKind::Runtime {
                    continue;
                }
                let r = run(w, jobs, concurrency, mode, kind).await?;
                let after = baseline(jobs, !with_baseline).await;
                let raw_drain = (before.0 + after.0) / 2.0;
                let raw_all = (before.1 + after.1) / 2.0;
                before = after;
                let n = jobs as f64;
                let drain = n / r.drain.as_secs_f64();
                let all = n / (r.drain + r.enqueue).as_secs_f64();
                println!(
                    "{:>8} {:>9} {:>10.0} {:>7.2} {:>11.0} {:>8.2} {:>11.1} {:>11.1} {:>13.0} {:>13.0} {:>9.3} {:>9.0} {:>9.0} {:>8.3}",
                    w,
                    mode.label(),
                    drain,
                    drain / raw_drain,
                    all,
                    all / raw_all,
                    r.claim_to_complete.0,
                    r.claim_to_complete.1,
                    r.enqueue_to_start.0,
                    r.enqueue_to_start.1,
                    r.xacts_per_job,
                    r.cpu.0,
                    r.cpu.1,
                    r.requests_per_job,
                );
                per_mode.push((mode, drain));
                match rounds.iter_mut().find(|(k, _)| *k == (w, mode)) {
                    Some((_, v)) => v.push((drain, drain / raw_drain)),
                    None => rounds.push(((w, mode), vec![(drain, drain / raw_drain)])),
                }
            }
            if let Some(&(_, on)) = per_mode.iter().find(|(m, _)| *m == Mode::On) {
                for &(m, off) in per_mode.iter().filter(|(m, _)| *m != Mode::On) {
                    println!("{:>8} batching on / {}: {:.1}×", "", m.label(), on / off);
                }
            }
        }
    }
    if repeat > 1 {
        println!("\nmedians of {repeat} rounds (drain):");
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        for ((w, mode), v) in &rounds {
            let jobs_s = median(v.iter().map(|x| x.0).collect());
            let ratio = median(v.iter().map(|x| x.1).collect());
            let ratios: Vec<String> = v.iter().map(|x| format!("{:.2}", x.1)).collect();
            println!(
                "{w:>8} {:>9} {jobs_s:>10.0} jobs/s, ×PG {ratio:.2} (rounds: {})",
                mode.label(),
                ratios.join(", ")
            );
        }
        for &w in workers {
            let of = |m: Mode| {
                rounds
                    .iter()
                    .find(|(k, _)| *k == (w, m))
                    .map(|(_, v)| median(v.iter().map(|x| x.0).collect()))
            };
            if let Some(on) = of(Mode::On) {
                for m in [Mode::PerJob, Mode::Off] {
                    if let Some(other) = of(m) {
                        println!("{w:>8} batching on / {} (medians): {:.1}×", m.label(), on / other);
                    }
                }
            }
        }
    }
    Ok(())
}
