//! One drain of a coordinator build (see the parent module for the figures).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runlease_tests::{CoordinatorProcess, TestDb, admin};

use super::{Build, Fleet, QUEUE, Run, SETTLE, mode_label, rides};
use crate::history::enqueue;
use crate::stats::{
    BackendCpu, Cpu, backends_gone, counters_settled, database_wal, ns_us, percentile, postmaster_pid,
    process_ticks, server_ticks, ticks_us, wal_lsn,
};

/// Drains `jobs` through `coordinators` processes of `build` over one
/// database, the workers spread over them in turn (worker `w` talks to
/// coordinator `w % coordinators`; Redis carries the wake-ups between them).
pub(crate) async fn drain(
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

    let drain_start: chrono::DateTime<chrono::Utc> =
        admin.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
    let wal_before = wal_lsn(&admin).await;
    let postmaster = postmaster_pid().await;
    let pg_all = server_ticks(postmaster);
    let pg_own = BackendCpu::start(&db.name).await;
    let coordinator = ticks(&pids);
    let bench = Cpu::now();
    let fleet = Fleet::start(&bases, workers, concurrency, ride, jobs);
    let done_at = fleet.finished(&build.name).await?;
    let progress = fleet.progress.clone();
    let requests = progress.requests.load(Ordering::Relaxed);
    let coordinator = ticks(&pids).saturating_sub(coordinator);
    let bench = Cpu::now().per_job_since(bench, jobs).0;
    let pg_own = pg_own.stop().await;
    let pg_all = server_ticks(postmaster).saturating_sub(pg_all);
    let wal_after = wal_lsn(&admin).await;
    let elapsed = done_at - fleet.started;
    let mut claim_to_complete = fleet.stop().await?;
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
