//! graphile-worker 0.17, measured beside runlease: `peers/graphile-worker`
//! in the bench's package (`peer.mjs` and a lockfile pinning 0.17.3), run
//! as a child process that prints its figures as one line of JSON. It talks
//! to PostgreSQL directly (no HTTP), each run in a fresh database of its
//! own on the same server, in its batched mode: a local queue that fetches
//! and locks many jobs per query, completions batched with no delay.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use runlease_tests::{TestDb, admin};
use serde::Deserialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::drain::{Run, SETTLE};
use crate::openloop::OpenLoop;
use crate::stats::{
    BackendCpu, backends_gone, counters_settled, database_wal, ns_us, postmaster_pid, process_ticks,
    server_ticks, ticks_us, wal_lsn,
};

/// Where the peer lives in this repository (`--graphile` overrides it).
pub(crate) fn default_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peers/graphile-worker")
}

/// Installs the peer's locked dependencies (`npm ci`) unless they are there.
pub(crate) async fn ensure_installed(dir: &Path) -> anyhow::Result<()> {
    if dir.join("node_modules/graphile-worker").exists() {
        return Ok(());
    }
    anyhow::ensure!(
        dir.join("package-lock.json").exists(),
        "no graphile-worker peer in {} (no package-lock.json)",
        dir.display()
    );
    eprintln!("  npm ci in {}", dir.display());
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(dir)
        .status()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run npm: {e}"))?;
    anyhow::ensure!(status.success(), "npm ci in {} failed: {status}", dir.display());
    Ok(())
}

/// `node peer.mjs MODE URL ...`, stdout piped.
fn node(dir: &Path, mode: &str, url: &str) -> Command {
    let mut c = Command::new("node");
    c.arg(dir.join("peer.mjs"))
        .arg(mode)
        .arg(url)
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    c
}

/// A fresh database's URL for the peer (no TLS, as the coordinator's).
async fn database() -> (TestDb, String) {
    let db = TestDb::empty().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}sslmode=disable", db.url);
    (db, url)
}

/// Runs the peer to its end and reads its last line of JSON.
async fn figures<T: serde::de::DeserializeOwned>(mut c: Command, what: &str) -> anyhow::Result<T> {
    let out = c
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run node: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "peer.mjs {what} failed ({}): {stdout}",
        out.status
    );
    let line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(line).map_err(|e| anyhow::anyhow!("peer.mjs {what} said {line:?}: {e}"))
}

#[derive(Deserialize)]
struct Drained {
    ms: f64,
}

#[derive(Deserialize)]
struct Enqueued {
    jobs: usize,
    ms: f64,
}

/// `addJobs` of 1,000 per call, one call at a time, `jobs` in all, into a
/// fresh schema: jobs/s.
pub(crate) async fn enqueue_rate(dir: &Path, jobs: usize) -> anyhow::Result<f64> {
    let (_db, url) = database().await;
    let mut c = node(dir, "enqueue", &url);
    c.arg(jobs.to_string());
    let e: Enqueued = figures(c, "enqueue").await?;
    Ok(e.jobs as f64 / (e.ms / 1e3))
}

/// One `addJob` per job on schedule, `rate` a second for `seconds`, over a
/// pool of `connections`; a pool of `concurrency` workers in a second Node
/// process (see `peer.mjs`).
pub(crate) async fn open_loop(
    dir: &Path,
    rate: usize,
    seconds: u64,
    concurrency: usize,
    connections: usize,
    grace: Duration,
) -> anyhow::Result<OpenLoop> {
    let (_db, url) = database().await;
    let mut c = node(dir, "open-loop", &url);
    c.args([
        rate.to_string(),
        seconds.to_string(),
        concurrency.to_string(),
        connections.to_string(),
        grace.as_secs().to_string(),
    ]);
    figures(c, "open-loop").await
}

/// A drain the way `drain` drains a coordinator: `peer.mjs drain` migrates
/// its schema and adds `jobs` no-op jobs, then on a line from us runs one
/// pool of `workers` concurrent jobs and reports the drain's milliseconds.
/// The "coordinator" figures are its Node process. It deletes finished
/// jobs, so there are no rows to time enqueue→start from.
pub(crate) async fn drain(dir: &Path, workers: usize, jobs: usize) -> anyhow::Result<Run> {
    let (db, url) = database().await;
    let admin = admin().await;
    admin.batch_execute("CHECKPOINT").await?;
    let wal_start = wal_lsn(&admin).await;
    let mut child = node(dir, "drain", &url)
        .arg(jobs.to_string())
        .arg(workers.to_string())
        .stdin(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot run node: {e}"))?;
    let pid = child.id().expect("node runs");
    let mut stdin = child.stdin.take().expect("piped");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    let line = lines.next_line().await?;
    anyhow::ensure!(
        line.as_deref() == Some("ready"),
        "peer.mjs drain said {line:?}, not ready"
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
    let ms = serde_json::from_str::<Drained>(&line)
        .map_err(|e| anyhow::anyhow!("peer.mjs drain said {line:?}: {e}"))?
        .ms;
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
