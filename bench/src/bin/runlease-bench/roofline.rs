//! The PostgreSQL roofline of `--drain`: the fastest a queue in one plain
//! table drains on this server, as `pgbench` measures it, with nothing
//! between the clients and PostgreSQL and no fencing beyond a guard column.
//!
//! The table holds what a minimal queue needs (no attempt history, no
//! idempotency keys, one partial index):
//!
//! ```sql
//! CREATE TABLE roofline_jobs (
//!     id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
//!     state text NOT NULL DEFAULT 'queued',
//!     run_lease bigint NOT NULL DEFAULT 0,
//!     payload jsonb NOT NULL,
//!     result jsonb,
//!     created_at timestamptz NOT NULL DEFAULT now(),
//!     claimed_at timestamptz,
//!     finished_at timestamptz);
//! CREATE INDEX roofline_jobs_queued ON roofline_jobs (id) WHERE state = 'queued';
//! ```
//!
//! `--jobs` rows are inserted 1,000 per statement (not timed), then 16
//! `pgbench` clients (prepared statements) each repeat two transactions:
//! claim 100 (`FOR UPDATE SKIP LOCKED`, state and lease bumped), and a
//! guarded complete of those 100 (`state = 'running' AND run_lease = …`),
//! until every row is done. Jobs/s is the rows over pgbench's own elapsed
//! time (its transactions over its tps, without connection set-up).

use std::time::Duration;

use runlease_tests::TestDb;
use tokio::process::Command;

use crate::stats::{
    BackendCpu, backends_gone, counters_settled, database_wal, ns_us, postmaster_pid, server_ticks, ticks_us,
    wal_lsn,
};

/// Where Debian's PostgreSQL 15 puts pgbench.
const PGBENCH: &str = "/usr/lib/postgresql/15/bin/pgbench";
/// Rows per claim and per complete.
const BATCH: usize = 100;
/// pgbench clients.
const CLIENTS: usize = 16;

const SCHEMA: &str = "
CREATE TABLE roofline_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    state text NOT NULL DEFAULT 'queued',
    run_lease bigint NOT NULL DEFAULT 0,
    payload jsonb NOT NULL,
    result jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz,
    finished_at timestamptz);
CREATE INDEX roofline_jobs_queued ON roofline_jobs (id) WHERE state = 'queued';
";

/// One pgbench transaction pair: the claim answers the claimed ids and
/// leases as two arrays (`\gset`), which the guarded complete takes.
const SCRIPT: &str = r"WITH c AS (SELECT id FROM roofline_jobs WHERE state = 'queued' ORDER BY id LIMIT 100 FOR UPDATE SKIP LOCKED), u AS (UPDATE roofline_jobs j SET state = 'running', run_lease = j.run_lease + 1, claimed_at = now() FROM c WHERE j.id = c.id RETURNING j.id, j.run_lease) SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(run_lease), '{}') AS leases FROM u
\gset
UPDATE roofline_jobs j SET state = 'done', result = 'null', finished_at = now() FROM unnest(:ids::bigint[], :leases::bigint[]) AS t(id, run_lease) WHERE j.id = t.id AND j.state = 'running' AND j.run_lease = t.run_lease;
";

/// What one roofline run measured.
pub struct Roofline {
    /// Rows done per second.
    pub jobs_per_s: f64,
    /// Transactions of the roofline database per job (drain).
    pub xacts_per_job: f64,
    /// Shared buffers its backends touched per job (drain).
    pub buffers_per_job: f64,
    /// WAL bytes per job: over the drain, and over insert + drain.
    pub wal_per_job: (f64, f64),
    /// WAL bytes per job of the roofline's database alone (pg_waldump):
    /// over the drain, and over insert + drain.
    pub db_wal_per_job: (f64, f64),
    /// PostgreSQL CPU µs per job over the drain: the roofline database's
    /// backends, and the whole server (postmaster and its children).
    pub pg_cpu: (f64, f64),
}

/// Transactions per second from pgbench's report (`tps = 423.1 (without
/// initial connection time)`).
fn tps(report: &str) -> Option<f64> {
    report
        .lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|t| t.parse().ok())
}

/// Runs the roofline over `jobs` rows in a database of its own.
pub async fn run(jobs: usize) -> anyhow::Result<Roofline> {
    let db = TestDb::empty().await;
    let client = db.client().await;
    client.batch_execute(SCHEMA).await?;
    // The first write of a page after a checkpoint logs the whole page: start
    // every run (roofline and drain alike) right after one.
    client.batch_execute("CHECKPOINT").await?;
    let wal_start = wal_lsn(&client).await;
    for chunk in 0..jobs.div_ceil(1000) {
        let from = (chunk * 1000) as i64;
        let to = ((chunk + 1) * 1000).min(jobs) as i64 - 1;
        client
            .execute(
                "INSERT INTO roofline_jobs (payload) SELECT to_jsonb(g) FROM generate_series($1::bigint, $2::bigint) g",
                &[&from, &to],
            )
            .await?;
    }
    // This connection's counters are published when it closes.
    drop(client);
    backends_gone(&db.name).await;
    let before = counters_settled(&db.name, Duration::ZERO).await;
    let admin = runlease_tests::admin().await;
    let wal_before = wal_lsn(&admin).await;

    let script = std::env::temp_dir().join(format!("{}.pgbench.sql", db.name));
    std::fs::write(&script, SCRIPT)?;
    // Each client claims BATCH rows per transaction pair; the last pairs find
    // fewer (or none) and end the run.
    let per_client = jobs.div_ceil(BATCH * CLIENTS);
    let (url, sep) = (db.url.clone(), if db.url.contains('?') { '&' } else { '?' });
    let postmaster = postmaster_pid().await;
    let cpu_all = server_ticks(postmaster);
    let cpu_own = BackendCpu::start(&db.name).await;
    let out = Command::new(PGBENCH)
        .args(["-n", "-M", "prepared", "-j", "1"])
        .args(["-c", &CLIENTS.to_string(), "-t", &per_client.to_string()])
        .arg("-f")
        .arg(&script)
        .arg(format!("{url}{sep}sslmode=disable"))
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run {PGBENCH}: {e} (apt-get install postgresql-15)"))?;
    let own = cpu_own.stop().await;
    let all = server_ticks(postmaster).saturating_sub(cpu_all);
    let wal_after = wal_lsn(&admin).await;
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tps = tps(&stdout).ok_or_else(|| anyhow::anyhow!("no tps in pgbench's output: {stdout}"))?;
    let transactions = (per_client * CLIENTS) as f64;
    let elapsed = transactions / tps;
    backends_gone(&db.name).await;
    let after = counters_settled(&db.name, Duration::ZERO).await;
    let done = db
        .scalar("SELECT count(*) FROM roofline_jobs WHERE state = 'done'", &[])
        .await;
    anyhow::ensure!(done as usize == jobs, "roofline: {done} of {jobs} rows done");
    let n = jobs as f64;
    let per_job = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / n);
    let db_wal_per_job = (
        per_job(database_wal(&db.name, wal_before, wal_after).await),
        per_job(database_wal(&db.name, wal_start, wal_after).await),
    );
    Ok(Roofline {
        db_wal_per_job,
        jobs_per_s: n / elapsed,
        xacts_per_job: (after.xacts - before.xacts) as f64 / n,
        buffers_per_job: (after.buffers - before.buffers) as f64 / n,
        wal_per_job: (
            (wal_after - wal_before) as f64 / n,
            (wal_after - wal_start) as f64 / n,
        ),
        pg_cpu: (ns_us(own) / n, ticks_us(all) / n),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn tps_is_read_from_pgbench_report() {
        let report = "transaction type: roofline.sql\nnumber of transactions actually processed: 208/208\nlatency average = 35.2 ms\ninitial connection time = 25.811 ms\ntps = 454.491223 (without initial connection time)\n";
        assert_eq!(super::tps(report), Some(454.491223));
        assert_eq!(super::tps("pgbench: error: connection failed"), None);
    }
}
