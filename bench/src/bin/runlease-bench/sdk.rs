//! `runlease-bench sdk`: the worker libraries against the Rust client. One
//! coordinator (in-process, batching on, a fresh database) serves every run;
//! each run preloads `--jobs` jobs on a queue of its own, then one no-op pull
//! worker with `--concurrency` handlers drains it: the Rust client's runtime
//! (in this process), the TypeScript library under Node.js
//! (`bench/sdk/noop_worker.mjs`) and the Python library, blocking and asyncio
//! (`bench/sdk/noop_worker.py`), each in a process of its own. A run's rate
//! is its jobs over the span from the first claim to the last finish, as
//! PostgreSQL recorded them (so a process's start-up is not counted). Rounds
//! are interleaved; each library's figure is also a ratio to the Rust
//! client's in the same round, and the table ends with the medians.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use runlease_client::protocol::producer::EnqueueJobRequest;
use runlease_client::protocol::{QueueName, WorkerId};
use runlease_client::{Client, JobContext, JobError, Worker};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// A worker to measure.
#[derive(Clone, Copy, PartialEq, Eq)]
enum System {
    Rust,
    TypeScriptNode,
    PythonBlocking,
    PythonAsyncio,
}

const SYSTEMS: [System; 4] = [
    System::Rust,
    System::TypeScriptNode,
    System::PythonBlocking,
    System::PythonAsyncio,
];

impl System {
    fn label(self) -> &'static str {
        match self {
            System::Rust => "Rust client",
            System::TypeScriptNode => "TypeScript (Node.js)",
            System::PythonBlocking => "Python, blocking",
            System::PythonAsyncio => "Python, asyncio",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            System::Rust => "rust",
            System::TypeScriptNode => "ts",
            System::PythonBlocking => "py-sync",
            System::PythonAsyncio => "py-async",
        }
    }
}

/// Where the libraries and their interpreters are.
pub struct Tools {
    /// `node` (20 or later).
    pub node: PathBuf,
    /// A Python with the `runlease` package installed.
    pub python: PathBuf,
}

impl Tools {
    /// `node` on PATH and the tests' Python environment
    /// (`scripts/sdk-python-venv.sh`), unless given.
    pub fn new(node: Option<PathBuf>, python: Option<PathBuf>) -> Self {
        let repo = repo();
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo.join("target"), PathBuf::from);
        Self {
            node: node.unwrap_or_else(|| "node".into()),
            python: python.unwrap_or_else(|| target.join("sdk-python-venv/bin/python")),
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        let dist = repo().join("sdk/typescript/dist/index.js");
        anyhow::ensure!(
            dist.exists(),
            "{} is missing: build the TypeScript library (cd sdk/typescript && npm ci && npm run build)",
            dist.display()
        );
        let ok = std::process::Command::new(&self.python)
            .args(["-c", "import runlease"])
            .status()
            .is_ok_and(|s| s.success());
        anyhow::ensure!(
            ok,
            "{} cannot import runlease: bash scripts/sdk-python-venv.sh makes that environment (or pass --python)",
            self.python.display()
        );
        Ok(())
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Preloads `jobs` jobs on `queue`, in batches of 1000.
async fn preload(client: &Client, queue: &QueueName, jobs: usize) -> anyhow::Result<()> {
    let mut batch = Vec::with_capacity(1000);
    for i in 0..jobs {
        batch.push(EnqueueJobRequest::new(queue.clone(), json!(i)));
        if batch.len() == 1000 || i + 1 == jobs {
            client.enqueue_batch(std::mem::take(&mut batch)).await?;
        }
    }
    Ok(())
}

/// Waits until no job of `queue` is queued or running (a probe every 20 ms).
async fn drained(db: &tokio_postgres::Client, queue: &str) -> anyhow::Result<()> {
    loop {
        let busy: bool = db
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM jobs WHERE queue = $1 AND state IN ('queued', 'running'))",
                &[&queue],
            )
            .await?
            .get(0);
        if !busy {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Jobs/s of `queue`'s drain: its done jobs over first claim → last finish.
async fn rate(db: &tokio_postgres::Client, queue: &str, jobs: usize) -> anyhow::Result<f64> {
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE a.outcome = 'completed'),
                    extract(epoch FROM max(a.finished_at) - min(a.claimed_at))::float8
               FROM job_attempts a JOIN jobs j ON j.id = a.job_id
              WHERE j.queue = $1",
            &[&queue],
        )
        .await?;
    let (done, secs): (i64, f64) = (row.get(0), row.get(1));
    anyhow::ensure!(
        done as usize == jobs,
        "{done} of {jobs} jobs of {queue} completed"
    );
    Ok(jobs as f64 / secs)
}

/// One system draining its queue: jobs/s.
async fn run(
    system: System,
    c: &TestCoordinator,
    db: &tokio_postgres::Client,
    tools: &Tools,
    round: usize,
    jobs: usize,
    concurrency: usize,
) -> anyhow::Result<f64> {
    let client = Client::new(c.api.base())?;
    let name = format!("bench-{}-{round}", system.slug());
    let queue = QueueName::new(name.clone()).unwrap();
    preload(&client, &queue, jobs).await?;
    if system == System::Rust {
        let stop = CancellationToken::new();
        let worker = Worker::builder(client)
            .worker_id(WorkerId::new(format!("bench-{name}")).unwrap())
            .concurrency(concurrency)
            .claim_wait(Duration::from_secs(1))
            .handle(queue, |_ctx: JobContext| async move {
                Ok::<_, JobError>(serde_json::Value::Null)
            })
            .build()?;
        let handle = tokio::spawn(worker.run(stop.clone()));
        drained(db, &name).await?;
        stop.cancel();
        handle.await?;
        return rate(db, &name, jobs).await;
    }
    let sdk = repo().join("bench/sdk");
    let (program, mut args) = match system {
        System::TypeScriptNode => (
            &tools.node,
            vec![sdk.join("noop_worker.mjs").display().to_string()],
        ),
        _ => (
            &tools.python,
            vec![sdk.join("noop_worker.py").display().to_string()],
        ),
    };
    args.extend([c.api.base().to_owned(), name.clone(), concurrency.to_string()]);
    match system {
        System::PythonBlocking => args.push("sync".into()),
        System::PythonAsyncio => args.push("asyncio".into()),
        _ => {}
    }
    let mut child = tokio::process::Command::new(program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| anyhow::anyhow!("{}: {e}", program.display()))?;
    let outcome = tokio::select! {
        d = drained(db, &name) => d,
        exit = child.wait() => Err(anyhow::anyhow!("{} exited early: {:?}", system.label(), exit?)),
    };
    outcome?;
    // SIGTERM: the worker drains (it holds nothing by now) and exits.
    let pid = child.id().unwrap_or_default().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()?;
    if tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .is_err()
    {
        child.kill().await?;
    }
    rate(db, &name, jobs).await
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs `repeat` interleaved rounds and prints the table.
pub async fn report(jobs: usize, concurrency: usize, repeat: usize, tools: Tools) -> anyhow::Result<()> {
    tools.check()?;
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.database.pool_size = 20;
        let sep = if cfg.database.url.contains('?') { '&' } else { '?' };
        cfg.database.url = format!("{}{sep}sslmode=disable", cfg.database.url);
        // Only this coordinator runs: no Redis round trip on enqueue.
        cfg.redis.url = String::new();
    })
    .await;
    let probe = db.client().await;
    println!(
        "no-op pull workers, {concurrency} handlers each, {jobs} preloaded jobs per run, one coordinator; \
         jobs/s from first claim to last finish; ratio = ÷ the Rust client's in the same round"
    );
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); SYSTEMS.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); SYSTEMS.len()];
    for round in 1..=repeat {
        let mut rust = f64::NAN;
        for (i, system) in SYSTEMS.into_iter().enumerate() {
            let r = run(system, &c, &probe, &tools, round, jobs, concurrency).await?;
            if system == System::Rust {
                rust = r;
            }
            rates[i].push(r);
            ratios[i].push(r / rust);
            println!(
                "round {round}  {:<22} {r:>8.0} jobs/s  {:>5.2}×",
                system.label(),
                r / rust
            );
        }
    }
    println!("\nmedians of {repeat} round(s)");
    println!("{:<22} {:>8} {:>7}", "worker", "jobs/s", "× Rust");
    for (i, system) in SYSTEMS.into_iter().enumerate() {
        println!(
            "{:<22} {:>8.0} {:>6.2}×",
            system.label(),
            median(rates[i].clone()),
            median(ratios[i].clone())
        );
    }
    c.stop().await?;
    Ok(())
}
