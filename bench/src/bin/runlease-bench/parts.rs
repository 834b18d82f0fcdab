//! `--pg-parts`: where PostgreSQL's work per job goes, part by part of the
//! schema. The same jobs go through the coordinator's own claim and finish
//! statements on the schema as migrated and on variants of it, each missing
//! one part (an index, the `CHECK` constraints, the primary key's
//! uniqueness) or storing ended jobs another way, and the difference is what
//! that part costs per job. The variants are questions, not proposals: each
//! part they take away keeps a promise of the protocol.
//!
//! A run: a fresh database migrated from the template, `--jobs` jobs
//! enqueued by `job_enqueue.sql` 1,000 per statement (no idempotency keys,
//! as `POST /v1/jobs/batch` without them), the variant's change, a
//! checkpoint, then one connection drains the queue in the shape of the
//! coordinator's transactions when claims ride finishes: each transaction
//! opened with the claim's settings, finishing (complete) the previous
//! claim's leases, then claiming `--slots` more (default [`SLOTS`], about
//! a claim at 256 workers; 32 to 64 is a batch at 16 workers, where the
//! work done once per statement and per commit weighs more). One
//! connection and nothing else: PostgreSQL's work without HTTP, the
//! coordinator or contention.
//! Per run:
//! - shared buffers touched per job (`pg_stat_database` blks_hit +
//!   blks_read, read once the connection has gone): a count of pages
//!   visited that does not drift with the machine's speed;
//! - WAL bytes per job, the database's own (pg_waldump);
//! - the backend's CPU µs per job over the drain (`/proc/PID/schedstat`).
//!
//! Rounds run the variants in a rotating order; the table gives the medians
//! and, for CPU, each variant's ratio to the schema as migrated in the same
//! round.

use std::time::Duration;

use runlease_coordinator::store::{sql, tally};
use runlease_tests::{TestDb, admin};
use tokio_postgres::types::Type;

use crate::drain::paired;
use crate::raw::{claim_slots, complete, enqueue_rows};
use crate::stats::{
    backends_gone, counters_settled, database_wal, med, median, ns_us, process_run_ns, wal_lsn,
};

/// Slots per claim statement by default: about what one claim carries at
/// 256 workers each asking for up to 8.
pub const SLOTS: usize = 512;
/// Queue of the jobs.
const QUEUE: &str = "parts";

/// One variant of the schema.
struct Variant {
    name: &'static str,
    /// Run on the migrated, loaded database before the drain.
    setup: &'static str,
    /// The finish statement, if not `lease_finish.sql`; it takes the same
    /// parameters.
    finish: Option<&'static str>,
}

/// Drops every `CHECK` constraint of `jobs`, and those of the domains its
/// columns are of.
const DROP_CHECKS: &str = "DO $$
DECLARE c text; d regtype;
BEGIN
    FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE jobs DROP CONSTRAINT %I', c);
    END LOOP;
    FOR d, c IN SELECT k.contypid::regtype, k.conname FROM pg_constraint k
                WHERE k.contype = 'c' AND k.contypid IN (SELECT atttypid FROM pg_attribute
                                                         WHERE attrelid = 'jobs'::regclass) LOOP
        EXECUTE format('ALTER DOMAIN %s DROP CONSTRAINT %I', d, c);
    END LOOP;
END $$";

/// Replaces the `CHECK` constraints of `jobs` by one holding them all
/// (PostgreSQL prepares each constraint of a table again for every
/// statement that writes it).
const MERGE_CHECKS: &str = "DO $$
DECLARE
    c text;
    merged text;
BEGIN
    SELECT string_agg(format('(%s)', substring(pg_get_constraintdef(oid) FROM '^CHECK \\((.*)\\)( NOT VALID)?$')), ' AND ')
    INTO merged
    FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'c';
    FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'jobs'::regclass AND contype = 'c' LOOP
        EXECUTE format('ALTER TABLE jobs DROP CONSTRAINT %I', c);
    END LOOP;
    EXECUTE format('ALTER TABLE jobs ADD CONSTRAINT jobs_checks CHECK (%s)', merged);
END $$";

/// A history table for ended jobs: the columns and checks of `jobs`, its
/// primary key and the listing index. Its deletes from `jobs` ask for no
/// recount or sweep: the move tallies itself, and an ended job's attempts
/// would stay under its id. The variants add a prune index.
macro_rules! history_table {
    () => {
        "CREATE TABLE job_history (LIKE jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
ALTER TABLE job_history ADD PRIMARY KEY (id);
CREATE INDEX job_history_list_idx ON job_history (queue, state, id);
DROP TRIGGER jobs_tallies_recount_delete ON jobs;
DROP TRIGGER jobs_attempts_sweep_delete ON jobs;
"
    };
}

/// The history table pruned as `jobs` is, through a b-tree on (queue,
/// state, finish time).
const HISTORY_BTREE_SETUP: &str = concat!(
    history_table!(),
    "CREATE INDEX job_history_prune_idx ON job_history (queue, state, finished_at)"
);

/// The history table with a BRIN index on the finish time instead (it
/// receives rows in finish order): next to no cost per row, but a prune by
/// it reads every block range old enough for the shortest retention,
/// whatever longer-kept queues' rows it holds.
const HISTORY_BRIN_SETUP: &str = concat!(
    history_table!(),
    "CREATE INDEX job_history_finished_brin ON job_history USING brin (finished_at)"
);

/// A finish that moves each completed job into `job_history` (a delete
/// from `jobs` and an insert there) instead of updating its row, guarded as
/// `lease_finish.sql` is and tallied the same way. Completes only (what
/// the drain sends); the parameters are `lease_finish.sql`'s.
const HISTORY_FINISH: &str = "WITH input AS (
    SELECT * FROM unnest($1::uuid[], $2::bigint[], $4::jsonb[]) AS t(id, run_lease, result)
), gone AS (
    DELETE FROM jobs j USING input i
    WHERE j.id = i.id AND CASE WHEN j.state = 'running' THEN j.run_lease = i.run_lease ELSE false END
    RETURNING j.*, i.result AS new_result
), moved AS (
    INSERT INTO job_history (id, queue, state, payload, result, error, priority, run_at, created_at,
                             updated_at, claimed_at, owned_by, run_lease, attempt, max_attempts,
                             timeout_ms, lease_expires_at, progress, idempotency_key,
                             cancel_requested_at, finished_at, dispatched_run_at, concurrency_key,
                             traceparent, final_outcome)
    SELECT id, queue, 'done', payload, new_result, error, priority, run_at, created_at,
           now(), claimed_at, owned_by, run_lease, attempt, max_attempts,
           timeout_ms, NULL, progress, idempotency_key,
           cancel_requested_at, now(), dispatched_run_at, concurrency_key,
           traceparent, 'completed'
    FROM gone
    RETURNING id, run_lease, queue, state, created_at, finished_at, traceparent IS NOT NULL AS traced
), tallied AS (
    INSERT INTO job_tallies (queue, tally, n)
    SELECT queue, state::text, count(*) FROM moved GROUP BY queue, state
)
SELECT id, run_lease, 'complete' AS action, queue, state, created_at, finished_at, traced FROM moved";

const VARIANTS: &[Variant] = &[
    Variant {
        name: "as migrated",
        setup: "",
        finish: None,
    },
    Variant {
        name: "without jobs_prune_idx",
        setup: "DROP INDEX jobs_prune_idx",
        finish: None,
    },
    Variant {
        name: "without jobs_list_idx",
        setup: "DROP INDEX jobs_list_idx",
        finish: None,
    },
    Variant {
        name: "without jobs_running_idx",
        setup: "DROP INDEX jobs_running_idx",
        finish: None,
    },
    Variant {
        name: "without the CHECK constraints",
        setup: DROP_CHECKS,
        finish: None,
    },
    Variant {
        name: "the CHECK constraints as one",
        setup: MERGE_CHECKS,
        finish: None,
    },
    Variant {
        name: "id indexed, not unique",
        setup: "ALTER TABLE jobs DROP CONSTRAINT jobs_pkey; CREATE INDEX jobs_id_idx ON jobs (id)",
        finish: None,
    },
    Variant {
        name: "ended jobs in a history table, b-tree prune index",
        setup: HISTORY_BTREE_SETUP,
        finish: Some(HISTORY_FINISH),
    },
    Variant {
        name: "ended jobs in a history table, BRIN prune index",
        setup: HISTORY_BRIN_SETUP,
        finish: Some(HISTORY_FINISH),
    },
];

/// What one run measured, per job.
struct Measured {
    buffers: f64,
    wal: f64,
    cpu_us: f64,
}

/// `lease_finish.sql`'s parameter types, for a finish that does not use
/// them all.
const FINISH_TYPES: &[Type] = &[
    Type::UUID_ARRAY,
    Type::INT8_ARRAY,
    Type::TEXT_ARRAY,
    Type::JSONB_ARRAY,
    Type::TEXT_ARRAY,
    Type::BOOL_ARRAY,
    Type::INT8_ARRAY,
    Type::JSONB_ARRAY,
    Type::INT8,
    Type::INT8,
];

async fn run(variant: &Variant, jobs: usize, slots: usize) -> anyhow::Result<Measured> {
    let db = TestDb::new().await;
    {
        let client = db.client().await;
        let enqueue = client.prepare(sql::JOB_ENQUEUE.sql()).await?;
        for chunk in 0..jobs.div_ceil(1000) {
            enqueue_rows(&client, &enqueue, QUEUE, (jobs - chunk * 1000).min(1000), false).await?;
        }
        if !variant.setup.is_empty() {
            client.batch_execute(variant.setup).await?;
        }
    }
    let admin = admin().await;
    admin.batch_execute("CHECKPOINT").await?;
    backends_gone(&db.name).await;
    let before = counters_settled(&db.name, Duration::ZERO).await;

    let client = db.client().await;
    let claim = client.prepare(sql::LEASE_CLAIM.sql()).await?;
    let finish = client
        .prepare_typed(variant.finish.unwrap_or(sql::LEASE_FINISH.sql()), FINISH_TYPES)
        .await?;
    let pid = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await?
        .get::<_, i32>(0);
    let pid = pid.unsigned_abs();
    let slots = vec!["parts-worker"; slots];
    let wal_start = wal_lsn(&admin).await;
    let cpu_start = backend_run_ns(pid)?;
    let mut held: Vec<tokio_postgres::Row> = Vec::new();
    let mut completed = 0;
    loop {
        client.batch_execute(tally::Open::Claims.sql()).await?;
        if !held.is_empty() {
            completed += complete(&client, &finish, &held).await?;
        }
        client.batch_execute(sql::CLAIM_SCAN_PLANNING).await?;
        held = claim_slots(&client, &claim, &[QUEUE], &slots).await?;
        client.batch_execute("COMMIT").await?;
        if held.is_empty() {
            break;
        }
    }
    let cpu = backend_run_ns(pid)? - cpu_start;
    let wal_end = wal_lsn(&admin).await;
    drop(client);
    anyhow::ensure!(
        completed == jobs,
        "{}: {completed} of {jobs} jobs completed",
        variant.name
    );
    backends_gone(&db.name).await;
    let after = counters_settled(&db.name, Duration::ZERO).await;
    let per_job = |x: f64| x / jobs as f64;
    Ok(Measured {
        buffers: per_job((after.buffers - before.buffers) as f64),
        wal: database_wal(&db.name, wal_start, wal_end)
            .await
            .map_or(f64::NAN, |b| per_job(b as f64)),
        cpu_us: per_job(ns_us(cpu)),
    })
}

/// The CPU time backend `pid` has used ([`process_run_ns`]).
fn backend_run_ns(pid: u32) -> anyhow::Result<u64> {
    process_run_ns(pid).ok_or_else(|| anyhow::anyhow!("backend {pid}: no /proc/{pid}/schedstat"))
}

/// Runs every variant `repeat` times and prints the table.
pub async fn report(jobs: usize, slots: usize, repeat: usize) -> anyhow::Result<()> {
    anyhow::ensure!(slots >= 1, "--slots must be at least 1");
    println!(
        "PostgreSQL's work per job by part of the schema: {jobs} jobs, claims of {slots} riding the finish of the previous claim's leases, one connection, {repeat} rounds"
    );
    let mut runs: Vec<Vec<Measured>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    for round in 0..repeat {
        for k in 0..VARIANTS.len() {
            let i = (k + round) % VARIANTS.len();
            let v = &VARIANTS[i];
            let m = run(v, jobs, slots).await?;
            println!(
                "  round {}: {}: {:.2} buffers/job, WAL {:.0} B/job, backend CPU {:.1} µs/job",
                round + 1,
                v.name,
                m.buffers,
                m.wal,
                m.cpu_us
            );
            runs[i].push(m);
        }
    }
    let cpu_of = |ms: &[Measured]| ms.iter().map(|m| m.cpu_us).collect::<Vec<f64>>();
    let base = &runs[0];
    let base_buffers = med(base, |m| m.buffers);
    let base_wal = med(base, |m| m.wal);
    let base_cpu = cpu_of(base);
    println!();
    println!(
        "| schema | PG buffers/job | ÷ as migrated | WAL B/job | ÷ as migrated | backend CPU µs/job (range) | ÷ as migrated, round by round (range) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (v, ms) in VARIANTS.iter().zip(&runs) {
        let buffers = med(ms, |m| m.buffers);
        let wal = med(ms, |m| m.wal);
        let cpu = cpu_of(ms);
        let (lo, hi) = cpu
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
                (lo.min(*x), hi.max(*x))
            });
        let ratio =
            paired(&base_cpu, &cpu).map_or("-".to_owned(), |(m, lo, hi)| format!("{m:.3} ({lo:.3}–{hi:.3})"));
        println!(
            "| {} | {buffers:.2} | {:.3} | {wal:.0} | {:.3} | {:.1} ({lo:.1}–{hi:.1}) | {ratio} |",
            v.name,
            buffers / base_buffers,
            wal / base_wal,
            median(cpu.clone()),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant still applies to the schema the migrations make and
    /// drains its jobs (the run checks each was completed), so the bench
    /// does not rot as the schema moves on.
    #[tokio::test]
    async fn every_variant_drains_its_jobs() {
        let jobs = 1_100;
        for v in VARIANTS {
            let m = run(v, jobs, 64).await.unwrap();
            assert!(m.buffers > 1.0, "{}: {} buffers/job", v.name, m.buffers);
            assert!(m.cpu_us > 0.0, "{}: {} µs/job", v.name, m.cpu_us);
        }
    }
}
