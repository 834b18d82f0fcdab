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
//!
//! That finite backlog, drained in id order, walks the index entries of the
//! rows it has already claimed; the **steady** roofline (`steady`) is the
//! whole life of a job in a loop instead, with nothing preloaded: each of 16
//! clients repeats three transactions, insert 100, claim 100 (`FOR UPDATE
//! SKIP LOCKED`), guarded complete of those 100, until `--jobs` rows are
//! done, in a table shaped like runlease's own (`STEADY_SCHEMA`: queue,
//! priority, run_at, attempt budget, lease expiry, ended rows kept; one
//! partial index on the queued rows by queue, priority, run_at, id). Its
//! database is set to `synchronous_commit = on`; the server's `fsync` is
//! read and printed with the figures.

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

const STEADY_SCHEMA: &str = "
CREATE TABLE roofline_jobs (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue text NOT NULL,
    state text NOT NULL DEFAULT 'queued',
    payload jsonb NOT NULL,
    result jsonb,
    priority integer NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    claimed_at timestamptz,
    owned_by text,
    run_lease bigint NOT NULL DEFAULT 0,
    attempt integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL DEFAULT 3,
    lease_expires_at timestamptz,
    finished_at timestamptz)
WITH (fillfactor = 90);
CREATE INDEX roofline_jobs_claim ON roofline_jobs (queue, priority, run_at, id) WHERE state = 'queued';
";

/// The steady loop: insert 100, claim 100, guarded complete of those 100,
/// each its own transaction.
const STEADY_SCRIPT: &str = r"INSERT INTO roofline_jobs (queue, payload) SELECT 'bench', to_jsonb(g) FROM generate_series(1, 100) g;
WITH c AS (SELECT id FROM roofline_jobs WHERE queue = 'bench' AND state = 'queued' AND run_at <= now() ORDER BY priority, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED), u AS (UPDATE roofline_jobs j SET state = 'running', run_lease = j.run_lease + 1, attempt = j.attempt + 1, owned_by = 'pgbench', claimed_at = now(), lease_expires_at = now() + interval '5 minutes', updated_at = now() FROM c WHERE j.id = c.id RETURNING j.id, j.run_lease) SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(run_lease), '{}') AS leases FROM u
\gset
UPDATE roofline_jobs j SET state = 'done', result = 'null', lease_expires_at = NULL, finished_at = now(), updated_at = now() FROM unnest(:ids::bigint[], :leases::bigint[]) AS t(id, run_lease) WHERE j.id = t.id AND j.state = 'running' AND j.run_lease = t.run_lease;
";

/// Which roofline: a preloaded backlog drained, or the steady loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `--jobs` rows preloaded, then claimed and completed.
    Finite,
    /// Insert, claim, complete in a loop from an empty table.
    Steady,
}

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

/// Runs the finite roofline over `jobs` rows in a database of its own.
pub async fn run(jobs: usize) -> anyhow::Result<Roofline> {
    run_shape(Shape::Finite, jobs).await
}

/// The server's `fsync` and `synchronous_commit` as a new connection sees them.
pub async fn durability() -> anyhow::Result<String> {
    let admin = runlease_tests::admin().await;
    let f: String = admin.query_one("SHOW fsync", &[]).await?.get(0);
    let s: String = admin.query_one("SHOW synchronous_commit", &[]).await?.get(0);
    Ok(format!("fsync {f}, synchronous_commit {s}"))
}

/// Runs a roofline of `shape` until `jobs` rows are done, in a database of
/// its own.
pub async fn run_shape(shape: Shape, jobs: usize) -> anyhow::Result<Roofline> {
    let db = TestDb::empty().await;
    let client = db.client().await;
    let (schema, script) = match shape {
        Shape::Finite => (SCHEMA, SCRIPT),
        Shape::Steady => (STEADY_SCHEMA, STEADY_SCRIPT),
    };
    client.batch_execute(schema).await?;
    client
        .batch_execute(&format!("ALTER DATABASE {} SET synchronous_commit = on", db.name))
        .await?;
    // The first write of a page after a checkpoint logs the whole page: start
    // every run (roofline and drain alike) right after one.
    client.batch_execute("CHECKPOINT").await?;
    let wal_start = wal_lsn(&client).await;
    let preload = if shape == Shape::Finite { jobs } else { 0 };
    for chunk in 0..preload.div_ceil(1000) {
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

    let script_file = std::env::temp_dir().join(format!("{}.pgbench.sql", db.name));
    std::fs::write(&script_file, script)?;
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
        .arg(&script_file)
        .arg(format!("{url}{sep}sslmode=disable"))
        .output()
        .await
        .map_err(|e| anyhow::anyhow!("cannot run {PGBENCH}: {e} (apt-get install postgresql-15)"))?;
    let own = cpu_own.stop().await;
    let all = server_ticks(postmaster).saturating_sub(cpu_all);
    let wal_after = wal_lsn(&admin).await;
    let _ = std::fs::remove_file(&script_file);
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
    let n = match shape {
        Shape::Finite => {
            anyhow::ensure!(done as usize == jobs, "roofline: {done} of {jobs} rows done");
            jobs as f64
        }
        Shape::Steady => {
            let inserted = (per_client * CLIENTS * BATCH) as i64;
            // A claim finds fewer than 100 only where other clients hold
            // rows locked or have not committed them yet: most rows
            // inserted are done (in a short run on a busy machine, down to
            // about nine in ten; the rate counts only the rows done).
            anyhow::ensure!(
                done * 4 >= inserted * 3,
                "steady roofline: {done} of {inserted} rows done"
            );
            done as f64
        }
    };
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
    use super::{Shape, run_shape};

    #[tokio::test]
    async fn both_rooflines_finish_what_they_take_on() {
        // Each errs unless (nearly) every row it inserted is done.
        for shape in [Shape::Finite, Shape::Steady] {
            let r = run_shape(shape, 3_200).await.unwrap();
            assert!(
                r.jobs_per_s.is_finite() && r.jobs_per_s > 0.0,
                "{shape:?}: {}",
                r.jobs_per_s
            );
            assert!(r.xacts_per_job > 0.0, "{shape:?}: no transactions counted");
        }
    }

    #[test]
    fn tps_is_read_from_pgbench_report() {
        let report = "transaction type: roofline.sql\nnumber of transactions actually processed: 208/208\nlatency average = 35.2 ms\ninitial connection time = 25.811 ms\ntps = 454.491223 (without initial connection time)\n";
        assert_eq!(super::tps(report), Some(454.491223));
        assert_eq!(super::tps("pgbench: error: connection failed"), None);
    }
}
