//! `--drain [NAME=]BINARY[,...]`: how fast coordinator builds drain a
//! preloaded queue through HTTP, against the PostgreSQL roofline
//! (`roofline.rs`) measured in the same run.
//!
//! Each build runs as its own process on a fresh database it migrates
//! itself, with its default settings (only the database URL is given, with
//! `sslmode=disable` like the roofline's pgbench, and the harness's secret
//! and port). The workers are outside it, in this process: bare protocol
//! loops over one HTTP client that claim up to `--concurrency` leases and
//! complete them all in one `POST /v1/finish`. A build that answers a finish
//! carrying `claim` with `leases` gets the next claim on the finish itself
//! (one request per cycle, the ride claim with `wait_ms: 0` so a finish is
//! never held back; a worker with nothing goes back to a long-poll claim);
//! this is found out once per build, on a probe job of another queue, and
//! printed as the build's mode.
//!
//! A run: `--jobs` jobs enqueued 1,000 per `POST /v1/jobs/batch` (not in the
//! drain figure), a pause of 11 s so every backend has published its
//! counters, then the workers start; the drain ends when the workers have
//! seen the last job's completion answered. Per run:
//! - drain jobs/s, and × the roofline run just before it;
//! - PostgreSQL transactions per job: `pg_stat_database` of the run's
//!   database over the drain, read after the coordinator process exited;
//! - PostgreSQL shared buffers touched per job (`blks_hit + blks_read`,
//!   read with the transactions): a count of pages visited that, unlike
//!   CPU time, does not drift with the machine's speed;
//! - WAL bytes per job over the drain and over enqueue + drain: the run's
//!   database's own (its records and its transactions' commits, read back
//!   with pg_waldump), and the server's (`pg_current_wal_lsn()`, which other
//!   clients of the same server add to);
//! - CPU µs per job over the drain, from `/proc`: PostgreSQL's backends of
//!   the run's database (to the nanosecond, from their `schedstat`), the
//!   whole server (the postmaster and its children, its other clients' work
//!   included), the coordinator process, and this process (the workers);
//! - HTTP requests per job (claims and finishes sent);
//! - claim→complete p50/p99 as the workers see it (claim answered → finish
//!   answered), and enqueue→start p50/p99 from the rows (`created_at` →
//!   `claimed_at`, counted from the drain's start for jobs enqueued before it).
//!
//! Rounds interleave the builds and a roofline run before each drain; the
//! table is the medians of `--repeat` rounds. PostgreSQL's per-statement
//! times (`pg_stat_statements`) are not measured: the module must be in the
//! server's `shared_preload_libraries`, which takes a restart of the server.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use runlease_tests::{CoordinatorProcess, TestDb, admin};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::history::enqueue;
use crate::roofline::{self, Roofline};
use crate::stats::{
    BackendCpu, Cpu, backends_gone, counters_settled, database_wal, med, median, ns_us, percentile,
    postmaster_pid, process_ticks, server_ticks, ticks_us, wal_lsn,
};

/// Which build (its index) ran with how many workers.
type BuildWorkers = (usize, usize, usize);

/// Queue the drained jobs are on.
const QUEUE: &str = "bench";
/// A long-poll claim's wait when a worker holds nothing.
const CLAIM_WAIT_MS: u64 = 1_000;
/// How long after the enqueue the counters are read: an idle backend
/// publishes its counters within ten seconds.
const SETTLE: Duration = Duration::from_secs(11);

/// A coordinator build to drain with.
#[derive(Debug, Clone)]
pub struct Build {
    /// What the table calls it.
    pub name: String,
    /// Its `runlease-coordinator` binary.
    pub binary: PathBuf,
}

impl Build {
    /// `NAME=PATH` or `PATH` (named by the path as given).
    pub fn parse(spec: &str) -> Self {
        match spec.split_once('=') {
            Some((name, path)) => Build {
                name: name.to_owned(),
                binary: path.into(),
            },
            None => Build {
                name: spec.to_owned(),
                binary: spec.into(),
            },
        }
    }
}

/// What drains in a round: a coordinator build, or graphile-worker.
#[derive(Debug, Clone)]
pub enum System {
    /// A coordinator build, driven over HTTP.
    Coordinator(Build),
    /// graphile-worker from `tests/peers/graphile-worker` (a directory with
    /// `drain.mjs` and its `node_modules`).
    Graphile(PathBuf),
}

impl System {
    fn name(&self) -> &str {
        match self {
            System::Coordinator(b) => &b.name,
            System::Graphile(_) => "graphile-worker 0.17",
        }
    }
}

#[derive(Serialize)]
struct ClaimBody<'a> {
    queues: [&'a str; 1],
    worker_id: &'a str,
    max_jobs: u32,
    wait_ms: u64,
}

#[derive(Serialize)]
struct FinishItemBody {
    lease_token: String,
    action: &'static str,
}

#[derive(Serialize)]
struct FinishBody<'a> {
    items: Vec<FinishItemBody>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<&'a ClaimBody<'a>>,
}

#[derive(Deserialize)]
struct LeaseAnswer {
    lease_token: String,
}

#[derive(Deserialize)]
struct ClaimAnswer {
    leases: Vec<LeaseAnswer>,
}

#[derive(Deserialize)]
struct FinishItemAnswer {
    status: String,
}

#[derive(Deserialize)]
struct FinishAnswer {
    items: Vec<FinishItemAnswer>,
    #[serde(default)]
    leases: Option<Vec<LeaseAnswer>>,
}

/// What the workers share: completions seen, requests sent, and when the
/// last completion was answered.
struct Progress {
    target: usize,
    ok: AtomicUsize,
    requests: AtomicU64,
    done_at: OnceLock<Instant>,
    /// A finish the coordinator refused (4xx): the run cannot end.
    refused: OnceLock<String>,
    done: tokio::sync::Notify,
}

/// Does `base` answer a finish carrying `claim` with `leases`? Found out on
/// one probe job of its own queue, which ends done either way.
async fn rides(http: &reqwest::Client, base: &str) -> anyhow::Result<bool> {
    let queue = "bench-probe";
    let status = http
        .post(format!("{base}/v1/jobs"))
        .json(&json!({"queue": queue, "payload": null}))
        .send()
        .await?
        .status();
    anyhow::ensure!(status.is_success(), "probe enqueue answered {status}");
    let claim = json!({"queues": [queue], "worker_id": "bench-probe", "max_jobs": 1, "wait_ms": 5_000});
    let answer: Value = http
        .post(format!("{base}/v1/claim"))
        .json(&claim)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let token = answer["leases"][0]["lease_token"].clone();
    anyhow::ensure!(token.is_string(), "probe claim answered {answer}");
    let items = json!([{"lease_token": token, "action": "complete"}]);
    let mut ride = claim.clone();
    ride["wait_ms"] = json!(0);
    let response = http
        .post(format!("{base}/v1/finish"))
        .json(&json!({"items": items, "claim": ride}))
        .send()
        .await?;
    if response.status().is_success() {
        let body: Value = response.json().await?;
        anyhow::ensure!(body["items"][0]["status"] == "ok", "probe finish answered {body}");
        return Ok(body.get("leases").is_some_and(Value::is_array));
    }
    // An older build refuses the unknown field; finish the probe without it.
    let body: Value = http
        .post(format!("{base}/v1/finish"))
        .json(&json!({"items": items}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    anyhow::ensure!(body["items"][0]["status"] == "ok", "probe finish answered {body}");
    Ok(false)
}

/// A bare worker until `stop`: claim up to `max_jobs`, complete them in one
/// finish (with the next claim on it when `ride`). Answers its
/// claim→complete latencies (ms).
async fn worker(
    http: reqwest::Client,
    base: Arc<str>,
    id: String,
    max_jobs: u32,
    ride: bool,
    progress: Arc<Progress>,
    stop: CancellationToken,
) -> Vec<f64> {
    let claim = ClaimBody {
        queues: [QUEUE],
        worker_id: &id,
        max_jobs,
        wait_ms: CLAIM_WAIT_MS,
    };
    let ride_claim = ClaimBody { wait_ms: 0, ..claim };
    let (claim_url, finish_url) = (format!("{base}/v1/claim"), format!("{base}/v1/finish"));
    let mut held: Vec<String> = Vec::new();
    let mut claimed_at = Instant::now();
    let mut latencies = Vec::new();
    loop {
        if held.is_empty() {
            progress.requests.fetch_add(1, Ordering::Relaxed);
            let sent = http.post(&claim_url).json(&claim).send();
            let answer = tokio::select! {
                () = stop.cancelled() => return latencies,
                r = sent => r,
            };
            let Ok(answer) = answer else { continue };
            let Ok(answer) = answer.json::<ClaimAnswer>().await else {
                continue;
            };
            claimed_at = Instant::now();
            held = answer.leases.into_iter().map(|l| l.lease_token).collect();
            if held.is_empty() {
                continue;
            }
        }
        let body = FinishBody {
            items: held
                .iter()
                .map(|t| FinishItemBody {
                    lease_token: t.clone(),
                    action: "complete",
                })
                .collect(),
            claim: ride.then_some(&ride_claim),
        };
        progress.requests.fetch_add(1, Ordering::Relaxed);
        let sent = http.post(&finish_url).json(&body).send();
        let answer = tokio::select! {
            () = stop.cancelled() => return latencies,
            r = sent => r,
        };
        // A finish is safe to repeat with the same tokens: go round again.
        let Ok(answer) = answer else { continue };
        let status = answer.status();
        if status.is_client_error() {
            let body = answer.text().await.unwrap_or_default();
            let _ = progress
                .refused
                .set(format!("a finish answered {status}: {body}"));
            progress.done.notify_one();
            return latencies;
        }
        if !status.is_success() {
            continue;
        }
        let Ok(answer) = answer.json::<FinishAnswer>().await else {
            continue;
        };
        let now = Instant::now();
        let ok = answer.items.iter().filter(|i| i.status == "ok").count();
        let ms = (now - claimed_at).as_secs_f64() * 1e3;
        latencies.extend(std::iter::repeat_n(ms, ok));
        if progress.ok.fetch_add(ok, Ordering::Relaxed) + ok >= progress.target {
            let _ = progress.done_at.set(now);
            progress.done.notify_one();
        }
        held = answer
            .leases
            .unwrap_or_default()
            .into_iter()
            .map(|l| l.lease_token)
            .collect();
        claimed_at = now;
    }
}

/// What one drain measured (per job unless said otherwise).
#[derive(Debug, Clone, Copy)]
struct Run {
    jobs_per_s: f64,
    mode: &'static str,
    xacts: f64,
    /// Shared buffers PostgreSQL's backends touched (drain).
    buffers: f64,
    /// WAL bytes: drain, enqueue + drain.
    wal: (f64, f64),
    /// WAL bytes of the run's database alone (pg_waldump): drain, enqueue + drain.
    db_wal: (f64, f64),
    /// PostgreSQL CPU µs: the database's backends, the whole server.
    pg_cpu: (f64, f64),
    /// PostgreSQL CPU µs of the database's backends over the enqueue
    /// (batches of 1,000 through `/v1/jobs/batch`; NaN: not measured).
    pg_enqueue_cpu: f64,
    coordinator_cpu: f64,
    bench_cpu: f64,
    requests: f64,
    /// ms p50, p99.
    claim_to_complete: (f64, f64),
    enqueue_to_start: (f64, f64),
}

/// Drains `jobs` through `coordinators` processes of `build` over one
/// database, the workers spread over them in turn (worker `w` talks to
/// coordinator `w % coordinators`; Redis carries the wake-ups between them).
async fn drain(
    build: &Build,
    workers: usize,
    jobs: usize,
    concurrency: u32,
    coordinators: usize,
) -> anyhow::Result<Run> {
    let db = TestDb::empty().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let env = [("RUNLEASE_DATABASE_URL", format!("{}{sep}sslmode=disable", db.url))];
    let mut processes = Vec::with_capacity(coordinators);
    for _ in 0..coordinators.max(1) {
        processes.push(CoordinatorProcess::start_binary(&build.binary, &db, &env).await);
    }
    let pids: Vec<u32> = processes
        .iter()
        .map(|p| p.child.id().expect("the coordinator runs"))
        .collect();
    let bases: Vec<Arc<str>> = processes.iter().map(|p| p.api.base().into()).collect();
    let base = bases[0].clone();
    let ticks = |pids: &[u32]| pids.iter().map(|p| process_ticks(*p).unwrap_or(0)).sum::<u64>();
    let http = reqwest::Client::builder()
        .http1_only()
        .timeout(Duration::from_secs(30))
        .build()?;
    let ride = rides(&http, &base).await?;

    let admin = admin().await;
    admin.batch_execute("CHECKPOINT").await?;
    let wal_start = wal_lsn(&admin).await;
    let pg_enqueue = BackendCpu::start(&db.name).await;
    enqueue(&http, &base, QUEUE, jobs).await;
    let pg_enqueue = pg_enqueue.stop().await;
    let before = counters_settled(&db.name, SETTLE).await;

    let progress = Arc::new(Progress {
        target: jobs,
        ok: AtomicUsize::new(0),
        requests: AtomicU64::new(0),
        done_at: OnceLock::new(),
        refused: OnceLock::new(),
        done: tokio::sync::Notify::new(),
    });
    let stop = CancellationToken::new();
    let drain_start: chrono::DateTime<chrono::Utc> =
        admin.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
    let wal_before = wal_lsn(&admin).await;
    let postmaster = postmaster_pid().await;
    let pg_all = server_ticks(postmaster);
    let pg_own = BackendCpu::start(&db.name).await;
    let coordinator = ticks(&pids);
    let bench = Cpu::now();
    let started = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|w| {
            tokio::spawn(worker(
                http.clone(),
                bases[w % bases.len()].clone(),
                format!("bench-{w}"),
                concurrency,
                ride,
                progress.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let waited = tokio::time::timeout(Duration::from_secs(600), async {
        while progress.done_at.get().is_none() && progress.refused.get().is_none() {
            progress.done.notified().await;
        }
    })
    .await;
    if let Some(refused) = progress.refused.get() {
        anyhow::bail!("{}: {refused}", build.name);
    }
    anyhow::ensure!(
        waited.is_ok(),
        "{}: {} of {jobs} jobs done after 10 minutes",
        build.name,
        progress.ok.load(Ordering::Relaxed)
    );
    let done_at = *progress.done_at.get().expect("set before the notification");
    let requests = progress.requests.load(Ordering::Relaxed);
    let coordinator = ticks(&pids).saturating_sub(coordinator);
    let bench = Cpu::now().per_job_since(bench, jobs).0;
    let pg_own = pg_own.stop().await;
    let pg_all = server_ticks(postmaster).saturating_sub(pg_all);
    let wal_after = wal_lsn(&admin).await;
    let elapsed = done_at - started;

    stop.cancel();
    let mut claim_to_complete = Vec::with_capacity(jobs);
    for h in handles {
        claim_to_complete.extend(h.await?);
    }
    let ok = progress.ok.load(Ordering::Relaxed);
    anyhow::ensure!(
        ok == jobs,
        "{}: {ok} completions answered ok for {jobs} jobs",
        build.name
    );
    drop(http);
    let per_job = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / jobs as f64);
    let db_wal = (
        per_job(database_wal(&db.name, wal_before, wal_after).await),
        per_job(database_wal(&db.name, wal_start, wal_after).await),
    );

    for process in &processes {
        process.terminate();
    }
    for process in &mut processes {
        if tokio::time::timeout(Duration::from_secs(20), process.child.wait())
            .await
            .is_err()
        {
            eprintln!("  {}: no exit 20 s after SIGTERM; killed", build.name);
            process.child.kill().await?;
        }
    }
    backends_gone(&db.name).await;
    let after = counters_settled(&db.name, Duration::ZERO).await;
    // Read the rows only now: the counters above are the drain's alone
    // (these two scans of the table would add their pages and transactions).
    let rows = db.client().await;
    let done: i64 = rows
        .query_one(
            "SELECT count(*) FROM jobs WHERE queue = $1 AND state = 'done'",
            &[&QUEUE],
        )
        .await?
        .get(0);
    anyhow::ensure!(
        done as usize == jobs,
        "{}: {done} of {jobs} jobs done",
        build.name
    );
    let mut enqueue_to_start: Vec<f64> = rows
        .query(
            "SELECT (extract(epoch FROM claimed_at - greatest(created_at, $2)) * 1000)::float8
             FROM jobs WHERE queue = $1 AND state = 'done'",
            &[&QUEUE, &drain_start],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    drop(rows);

    claim_to_complete.sort_by(f64::total_cmp);
    enqueue_to_start.sort_by(f64::total_cmp);
    let n = jobs as f64;
    let xacts = (after.xacts - before.xacts) as f64 / n;
    Ok(Run {
        jobs_per_s: n / elapsed.as_secs_f64(),
        mode: mode_label(ride),
        xacts,
        buffers: (after.buffers - before.buffers) as f64 / n,
        db_wal,
        wal: (
            (wal_after - wal_before) as f64 / n,
            (wal_after - wal_start) as f64 / n,
        ),
        pg_cpu: (ns_us(pg_own) / n, ticks_us(pg_all) / n),
        pg_enqueue_cpu: ns_us(pg_enqueue) / n,
        coordinator_cpu: ticks_us(coordinator) / n,
        bench_cpu: bench,
        requests: requests as f64 / n,
        claim_to_complete: (
            percentile(&claim_to_complete, 0.5),
            percentile(&claim_to_complete, 0.99),
        ),
        enqueue_to_start: (
            percentile(&enqueue_to_start, 0.5),
            percentile(&enqueue_to_start, 0.99),
        ),
    })
}

/// graphile-worker drained the same way: `drain.mjs` migrates its schema
/// and enqueues `jobs` no-op jobs, then on a line from us runs one pool of
/// `workers` concurrent jobs in its batched mode (a local queue fetching
/// and locking many jobs per query, completions batched) and reports the
/// drain's milliseconds. It talks to PostgreSQL directly: no HTTP, and the
/// "coordinator" figures are its Node process. It deletes finished jobs, so
/// there are no rows to time enqueue→start from.
async fn graphile(dir: &std::path::Path, workers: usize, jobs: usize) -> anyhow::Result<Run> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let db = TestDb::empty().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let admin = admin().await;
    admin.batch_execute("CHECKPOINT").await?;
    let wal_start = wal_lsn(&admin).await;
    let mut child = tokio::process::Command::new("node")
        .arg(dir.join("drain.mjs"))
        .arg(format!("{}{sep}sslmode=disable", db.url))
        .arg(jobs.to_string())
        .arg(workers.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run node: {e}"))?;
    let pid = child.id().expect("node runs");
    let mut stdin = child.stdin.take().expect("piped");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let line = lines.next_line().await?;
    anyhow::ensure!(
        line.as_deref() == Some("ready"),
        "drain.mjs said {line:?}, not ready"
    );
    let before = counters_settled(&db.name, SETTLE).await;
    let wal_before = wal_lsn(&admin).await;
    let postmaster = postmaster_pid().await;
    let pg_all = server_ticks(postmaster);
    let pg_own = BackendCpu::start(&db.name).await;
    let node = process_ticks(pid).unwrap_or(0);
    stdin.write_all(b"go\n").await?;
    stdin.flush().await?;
    let line = lines.next_line().await?.unwrap_or_default();
    let node = process_ticks(pid).unwrap_or(0).saturating_sub(node);
    let pg_own = pg_own.stop().await;
    let pg_all = server_ticks(postmaster).saturating_sub(pg_all);
    let wal_after = wal_lsn(&admin).await;
    let ms: f64 = line
        .strip_prefix("done ")
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("drain.mjs said {line:?}, not done MS"))?;
    if tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .is_err()
    {
        child.kill().await?;
    }
    backends_gone(&db.name).await;
    let after = counters_settled(&db.name, Duration::ZERO).await;
    let left = db
        .scalar("SELECT count(*) FROM graphile_worker._private_jobs", &[])
        .await;
    anyhow::ensure!(
        left == 0,
        "graphile-worker: {left} of {jobs} jobs left after the drain"
    );
    let n = jobs as f64;
    let per_job = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / n);
    Ok(Run {
        jobs_per_s: n / (ms / 1e3),
        mode: "local queue, batched completes",
        xacts: (after.xacts - before.xacts) as f64 / n,
        buffers: (after.buffers - before.buffers) as f64 / n,
        db_wal: (
            per_job(database_wal(&db.name, wal_before, wal_after).await),
            per_job(database_wal(&db.name, wal_start, wal_after).await),
        ),
        wal: (
            (wal_after - wal_before) as f64 / n,
            (wal_after - wal_start) as f64 / n,
        ),
        pg_cpu: (ns_us(pg_own) / n, ticks_us(pg_all) / n),
        pg_enqueue_cpu: f64::NAN,
        coordinator_cpu: ticks_us(node) / n,
        bench_cpu: f64::NAN,
        requests: f64::NAN,
        claim_to_complete: (f64::NAN, f64::NAN),
        enqueue_to_start: (f64::NAN, f64::NAN),
    })
}

/// A system's name in the report, with its coordinator count beyond one.
fn label(system: &System, coordinators: usize) -> String {
    if coordinators > 1 {
        format!("{}, {coordinators} coordinators", system.name())
    } else {
        system.name().to_owned()
    }
}

fn mode_label(ride: bool) -> &'static str {
    if ride { "finish+claim" } else { "claim, finish" }
}

fn print_roofline(r: &Roofline, label: &str) {
    eprintln!(
        "  {label}roofline: {:.0} jobs/s, {:.3} xacts/job, {:.1} buffers/job, WAL {:.0}/{:.0} B/job (server {:.0}/{:.0}), PG CPU {:.1}/{:.1} µs/job",
        r.jobs_per_s,
        r.xacts_per_job,
        r.buffers_per_job,
        r.db_wal_per_job.0,
        r.db_wal_per_job.1,
        r.wal_per_job.0,
        r.wal_per_job.1,
        r.pg_cpu.0,
        r.pg_cpu.1
    );
}

pub async fn report(
    systems: &[System],
    workers: &[usize],
    jobs: usize,
    concurrency: usize,
    rounds: usize,
    coordinators: &[usize],
) -> anyhow::Result<Option<f64>> {
    let concurrency = u32::try_from(concurrency)?;
    for s in systems {
        match s {
            System::Coordinator(b) => anyhow::ensure!(
                b.binary.exists(),
                "{}: no such binary {}",
                b.name,
                b.binary.display()
            ),
            System::Graphile(dir) => anyhow::ensure!(
                dir.join("node_modules/graphile-worker").exists(),
                "no graphile-worker in {} (npm ci there first)",
                dir.display()
            ),
        }
    }
    // (build, workers) → runs, each with the roofline run just before it.
    let mut runs: Vec<(BuildWorkers, Vec<(Run, f64)>)> = Vec::new();
    let mut rooflines: Vec<Roofline> = Vec::new();
    for round in 0..rounds {
        for &w in workers {
            for (b, system) in systems.iter().enumerate() {
                for &k in coordinators {
                    if k > 1 && matches!(system, System::Graphile(_)) {
                        continue;
                    }
                    let r = roofline::run(jobs).await?;
                    print_roofline(&r, &format!("round {}: ", round + 1));
                    let d = match system {
                        System::Coordinator(build) => drain(build, w, jobs, concurrency, k).await?,
                        System::Graphile(dir) => graphile(dir, w, jobs).await?,
                    };
                    eprintln!(
                        "  round {}: {}, {w} workers ({}): {:.0} jobs/s, ×{:.2} roofline, {:.3} xacts/job, {:.1} buffers/job, WAL {:.0}/{:.0} B/job (server {:.0}/{:.0}), PG CPU {:.1}/{:.1} µs/job, coordinator {:.1} µs/job, {:.3} req/job",
                        round + 1,
                        label(system, k),
                        d.mode,
                        d.jobs_per_s,
                        d.jobs_per_s / r.jobs_per_s,
                        d.xacts,
                        d.buffers,
                        d.db_wal.0,
                        d.db_wal.1,
                        d.wal.0,
                        d.wal.1,
                        d.pg_cpu.0,
                        d.pg_cpu.1,
                        d.coordinator_cpu,
                        d.requests
                    );
                    let ratio = d.jobs_per_s / r.jobs_per_s;
                    match runs.iter_mut().find(|(key, _)| *key == (b, w, k)) {
                        Some((_, v)) => v.push((d, ratio)),
                        None => runs.push(((b, w, k), vec![(d, ratio)])),
                    }
                    rooflines.push(r);
                }
            }
        }
    }

    println!(
        "runlease-bench --drain: {jobs} preloaded jobs per run, drained by outside HTTP workers claiming up to {concurrency} and completing them in one /v1/finish; each coordinator build its own process on a fresh database, default settings; medians of {rounds} interleaved rounds, a roofline run before every drain"
    );
    println!(
        "roofline: pgbench, 16 clients, claim 100 with FOR UPDATE SKIP LOCKED then a guarded complete of those 100, over the same number of rows in a plain table"
    );
    println!(
        "WAL: over the drain / over enqueue + drain, of the run's database alone (pg_waldump) and of the whole server (pg_current_wal_lsn, other clients included); PG buffers: shared buffers the run's database's backends touched (blks_hit + blks_read), the same whatever the machine's speed; PG CPU: the run's database's backends / the whole server (postmaster and its children); bench CPU: this process (the workers)\n"
    );
    println!(
        "| system | workers | mode | drain jobs/s | × roofline | PG xacts/job | PG buffers/job | WAL B/job drain / enq+drain | server WAL B/job drain / enq+drain | PG CPU µs/job (backends) | PG CPU µs/job (server) | PG CPU µs/job enqueue | coordinator CPU µs/job | bench CPU µs/job | HTTP req/job | claim→complete p50/p99 ms | enqueue→start p50/p99 ms | rounds (jobs/s) |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let all: Vec<String> = rooflines.iter().map(|r| format!("{:.0}", r.jobs_per_s)).collect();
    println!(
        "| PostgreSQL roofline (pgbench) | 16 clients | claim 100, complete 100 | {:.0} | 1.00 | {:.3} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} | {:.1} | – | – | – | – | – | – | {} |",
        med(&rooflines, |r| r.jobs_per_s),
        med(&rooflines, |r| r.xacts_per_job),
        med(&rooflines, |r| r.buffers_per_job),
        med(&rooflines, |r| r.db_wal_per_job.0),
        med(&rooflines, |r| r.db_wal_per_job.1),
        med(&rooflines, |r| r.wal_per_job.0),
        med(&rooflines, |r| r.wal_per_job.1),
        med(&rooflines, |r| r.pg_cpu.0),
        med(&rooflines, |r| r.pg_cpu.1),
        all.join(", ")
    );
    for ((b, w, k), v) in &runs {
        let mode = if v.iter().all(|(r, _)| r.mode == v[0].0.mode) {
            v[0].0.mode
        } else {
            "mixed"
        };
        let all: Vec<String> = v.iter().map(|(r, _)| format!("{:.0}", r.jobs_per_s)).collect();
        let row = format!(
            "| {} | {w} | {mode} | {:.0} | {:.2} | {:.3} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.1} / {:.1} | {:.0} / {:.0} | {} |",
            label(&systems[*b], *k),
            med(v, |(r, _)| r.jobs_per_s),
            med(v, |(_, x)| *x),
            med(v, |(r, _)| r.xacts),
            med(v, |(r, _)| r.buffers),
            med(v, |(r, _)| r.db_wal.0),
            med(v, |(r, _)| r.db_wal.1),
            med(v, |(r, _)| r.wal.0),
            med(v, |(r, _)| r.wal.1),
            med(v, |(r, _)| r.pg_cpu.0),
            med(v, |(r, _)| r.pg_cpu.1),
            med(v, |(r, _)| r.pg_enqueue_cpu),
            med(v, |(r, _)| r.coordinator_cpu),
            med(v, |(r, _)| r.bench_cpu),
            med(v, |(r, _)| r.requests),
            med(v, |(r, _)| r.claim_to_complete.0),
            med(v, |(r, _)| r.claim_to_complete.1),
            med(v, |(r, _)| r.enqueue_to_start.0),
            med(v, |(r, _)| r.enqueue_to_start.1),
            all.join(", ")
        );
        // graphile-worker has no HTTP requests nor rows to time.
        println!("{}", row.replace("NaN / NaN", "–").replace("NaN", "–"));
    }
    print_paired(systems, &runs);
    // The first system's median at the most workers, one process: what a
    // push drain is set beside.
    let most = workers.iter().copied().max().unwrap_or(0);
    Ok(runs
        .iter()
        .find(|((b, w, k), _)| *b == 0 && *w == most && *k == 1)
        .map(|(_, v)| med(v, |(r, _)| r.jobs_per_s)))
}

/// Each build against the first one named, round by round: the drains of a
/// round at one worker count run back to back, tens of seconds apart, so
/// their ratio shares the machine's speed at the time (it drifts within a run),
/// which the ratio of two medians over the whole run does not.
fn print_paired(systems: &[System], runs: &[(BuildWorkers, Vec<(Run, f64)>)]) {
    if systems.len() < 2 {
        return;
    }
    let first = systems[0].name();
    println!(
        "\nagainst {first}, round by round (the median of each round's ratio, and its range over the rounds)\n"
    );
    println!(
        "| system | workers | drain jobs/s ÷ {first} | PG CPU µs/job (backends) ÷ {first} | PG buffers/job ÷ {first} | coordinator CPU µs/job ÷ {first} | WAL B/job drain ÷ {first} |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for ((b, w, k), v) in runs {
        if *b == 0 {
            continue;
        }
        let Some((_, base)) = runs.iter().find(|(key, _)| *key == (0, *w, *k)) else {
            continue;
        };
        let cell = |f: fn(&Run) -> f64| {
            let (this, first): (Vec<f64>, Vec<f64>) =
                v.iter().zip(base).map(|((r, _), (q, _))| (f(r), f(q))).unzip();
            paired(&first, &this).map_or_else(
                || "–".to_owned(),
                |(m, lo, hi)| format!("{m:.2} ({lo:.2}–{hi:.2})"),
            )
        };
        println!(
            "| {} | {w} | {} | {} | {} | {} | {} |",
            label(&systems[*b], *k),
            cell(|r| r.jobs_per_s),
            cell(|r| r.pg_cpu.0),
            cell(|r| r.buffers),
            cell(|r| r.coordinator_cpu),
            cell(|r| r.db_wal.0),
        );
    }
}

/// The ratios `other[i] / base[i]` of the rounds where both are figures:
/// their median, lowest and highest (`None` when no round has both).
pub(crate) fn paired(base: &[f64], other: &[f64]) -> Option<(f64, f64, f64)> {
    let mut ratios: Vec<f64> = base
        .iter()
        .zip(other)
        .filter(|(b, o)| b.is_finite() && o.is_finite() && **b > 0.0)
        .map(|(b, o)| o / b)
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let (lo, hi) = (ratios[0], ratios[ratios.len() - 1]);
    Some((median(ratios), lo, hi))
}

#[cfg(test)]
mod tests {
    use super::{Build, paired};

    #[test]
    fn ratios_are_taken_round_by_round() {
        // The base drifts; each round's ratio is 0.5 whatever the drift.
        let (m, lo, hi) = paired(&[40.0, 30.0, 20.0], &[20.0, 15.0, 10.0]).unwrap();
        assert_eq!((m, lo, hi), (0.5, 0.5, 0.5));
        // Rounds without a figure on either side (or a zero base) are left out.
        let (m, lo, hi) = paired(&[10.0, f64::NAN, 10.0, 10.0, 0.0], &[6.0, 5.0, 8.0, 7.0, 1.0]).unwrap();
        assert_eq!((m, lo, hi), (0.7, 0.6, 0.8));
        assert!(paired(&[f64::NAN], &[1.0]).is_none());
    }

    #[test]
    fn builds_are_named_or_called_by_their_path() {
        let b = Build::parse("old=/tmp/x/runlease-coordinator");
        assert_eq!(
            (b.name.as_str(), b.binary.to_str()),
            ("old", Some("/tmp/x/runlease-coordinator"))
        );
        let b = Build::parse("target/release/runlease-coordinator");
        assert_eq!(b.name, "target/release/runlease-coordinator");
        assert_eq!(b.binary.to_str(), Some("target/release/runlease-coordinator"));
    }
}
