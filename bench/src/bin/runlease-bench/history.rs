//! `--history 0,1000000,10000000`: does runlease slow down as history piles
//! up? One database grows through the given numbers of terminal jobs (each
//! with its attempt row, ten queues, 80% done, 15% failed, 5% cancelled).
//! At each size a coordinator process (the release binary, retention off)
//! answers `/metrics` and `/v1/queues` a few hundred times (p50/p99), then
//! outside HTTP workers drain fresh jobs (jobs/s, against the drain at the
//! first size). Then pruning: the rate at which one coordinator deletes the
//! expired history, and, on a fresh database, whether pruning keeps up with
//! a sustained drain whose jobs expire a second after they finish.

use std::time::{Duration, Instant};

use runlease_client::Client;
use runlease_client::protocol::{QueueName, WorkerId};
use runlease_tests::{CoordinatorProcess, TestDb};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::stats::percentile;
use crate::throughput::lean_worker;

const PROBES: usize = 300;
const WORKERS: usize = 256;
const CLAIM: u32 = 8;

/// Appends `n` terminal jobs (ids after `start`), their attempts, and the
/// tally rows the triggers would have written had the rows arrived one
/// transition at a time (inserting them terminal skips that).
async fn grow(db: &TestDb, start: usize, n: usize) {
    let client = db.client().await;
    let step = 500_000;
    let mut at = start;
    while at < start + n {
        let count = step.min(start + n - at);
        client
            .execute(
                "WITH j AS (
                   INSERT INTO jobs (id, queue, state, payload, result, error, run_at, created_at,
                                     updated_at, claimed_at, owned_by, run_lease, attempt,
                                     max_attempts, idempotency_key, finished_at, final_outcome)
                   SELECT (lpad(to_hex(t), 12, '0') || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
                          'hist-' || (g % 10),
                          s::job_state,
                          jsonb_build_object('n', g, 'pad', 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'),
                          CASE WHEN s = 'done' THEN '{\"ok\": true}'::jsonb END,
                          CASE WHEN s <> 'done' THEN 'boom' END,
                          to_timestamp(t / 1000.0), to_timestamp(t / 1000.0), to_timestamp(t / 1000.0 + 1),
                          to_timestamp(t / 1000.0), 'w', 1, 1, 4, 'k' || g, to_timestamp(t / 1000.0 + 1),
                          -- As a finish leaves them: the attempt that ended a
                          -- done or failed job stays on its row.
                          CASE s WHEN 'done' THEN 'completed' WHEN 'failed' THEN 'failed' END::attempt_outcome
                   FROM (SELECT g, md5(g::text) AS h,
                                -- 30 days back, one job every ms or so, oldest first
                                (extract(epoch FROM now() - interval '30 days') * 1000)::bigint + g / 4 AS t,
                                CASE WHEN g % 20 = 0 THEN 'cancelled' WHEN g % 20 < 4 THEN 'failed' ELSE 'done' END AS s
                         FROM generate_series($1::bigint, $2::bigint) AS g) x
                   RETURNING id, queue, state, claimed_at, finished_at, error),
                 a AS (
                   INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
                   SELECT id, 1, 'w', claimed_at, finished_at,
                          'cancelled'::attempt_outcome, error, state
                   FROM j WHERE state = 'cancelled')
                 INSERT INTO job_tallies (queue, tally, n)
                 SELECT queue, state::text, count(*) FROM j GROUP BY queue, state",
                &[&(at as i64), &((at + count - 1) as i64)],
            )
            .await
            .unwrap();
        at += count;
    }
    client.batch_execute("VACUUM ANALYZE jobs").await.unwrap();
    client
        .batch_execute("VACUUM ANALYZE job_attempt_log")
        .await
        .unwrap();
    // Write the inserted pages out now, so the drain that follows does not
    // pay for this checkpoint (and its full-page writes) as if it were its own.
    client.batch_execute("CHECKPOINT").await.unwrap();
}

async fn table_mib(db: &TestDb) -> f64 {
    let bytes = db
        .scalar(
            "SELECT (pg_total_relation_size('jobs') + pg_total_relation_size('job_attempt_log'))::bigint",
            &[],
        )
        .await;
    bytes as f64 / 1_048_576.0
}

/// p50 and p99 in ms of `PROBES` sequential GETs of `path`.
async fn probe(http: &reqwest::Client, base: &str, path: &str) -> (f64, f64) {
    let mut ms = Vec::with_capacity(PROBES);
    for _ in 0..PROBES {
        let started = Instant::now();
        let response = http.get(format!("{base}{path}")).send().await.unwrap();
        assert!(
            response.status().is_success(),
            "GET {path}: {}",
            response.status()
        );
        response.bytes().await.unwrap();
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    (percentile(&ms, 0.5), percentile(&ms, 0.99))
}

/// Enqueues `n` jobs on `queue` through `POST /v1/jobs/batch`, 1,000 at a time.
pub(crate) async fn enqueue(http: &reqwest::Client, base: &str, queue: &str, n: usize) {
    for chunk in 0..n.div_ceil(1000) {
        let count = (n - chunk * 1000).min(1000);
        let jobs: Vec<Value> = (0..count)
            .map(|i| json!({"queue": queue, "payload": i}))
            .collect();
        http.post(format!("{base}/v1/jobs/batch"))
            .json(&json!({"jobs": jobs}))
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            // Read as a client would: the answer holds every job, and a
            // connection whose answer was left unread is not reused.
            .bytes()
            .await
            .unwrap();
    }
}

async fn queue_count(http: &reqwest::Client, base: &str, queue: &str, state: &str) -> i64 {
    let body: Value = http
        .get(format!("{base}/v1/queues/{queue}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["counts"][state].as_i64().unwrap_or(0)
}

async fn metric_sum(http: &reqwest::Client, base: &str, prefix: &str) -> f64 {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn start_workers(base: &str, queue: &str, stop: &CancellationToken) -> Vec<tokio::task::JoinHandle<()>> {
    let client = Client::builder(base)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    (0..WORKERS)
        .map(|w| {
            tokio::spawn(lean_worker(
                client.clone(),
                WorkerId::new(format!("bench-{w}")).unwrap(),
                QueueName::new(queue).unwrap(),
                CLAIM,
                false,
                stop.clone(),
            ))
        })
        .collect()
}

/// Drains `n` fresh jobs with outside workers; jobs/s.
async fn drain(http: &reqwest::Client, base: &str, queue: &str, n: usize) -> f64 {
    enqueue(http, base, queue, n).await;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let workers = start_workers(base, queue, &stop);
    while queue_count(http, base, queue, "done").await < n as i64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    for w in workers {
        let _ = w.await;
    }
    rate
}

fn coordinator_env(retention_ms: u64, prune_interval_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("RUNLEASE_DATABASE_POOL_SIZE", "20".into()),
        ("RUNLEASE_REDIS_URL", String::new()),
        ("RUNLEASE_RETENTION_DONE_MS", retention_ms.to_string()),
        ("RUNLEASE_RETENTION_FAILED_MS", retention_ms.to_string()),
        ("RUNLEASE_PRUNE_INTERVAL_MS", prune_interval_ms.to_string()),
        ("RUST_LOG", "warn".into()),
    ]
}

pub async fn report(sizes: &[usize], fresh: usize) -> anyhow::Result<()> {
    let http = reqwest::Client::new();
    let db = TestDb::new().await;
    let mut have = 0;
    let mut first_drain: Option<f64> = None;
    println!(
        "history (terminal jobs) | table+attempts MiB | /metrics p50/p99 ms | /v1/queues p50/p99 ms | drain {fresh} fresh jobs/s | × first size"
    );
    for (round, &size) in sizes.iter().enumerate() {
        if size > have {
            let started = Instant::now();
            grow(&db, have, size - have).await;
            eprintln!(
                "  inserted {} terminal jobs in {:.0} s",
                size - have,
                started.elapsed().as_secs_f64()
            );
            have = size;
        }
        let process = CoordinatorProcess::start(&db, &coordinator_env(0, 3_600_000)).await;
        let base = process.api.base().to_owned();
        // Warm the connections and statement caches first.
        probe(&http, &base, "/metrics").await;
        let metrics = probe(&http, &base, "/metrics").await;
        let queues = probe(&http, &base, "/v1/queues").await;
        let rate = drain(&http, &base, &format!("fresh-{round}"), fresh).await;
        let base_rate = *first_drain.get_or_insert(rate);
        println!(
            "{size:>23} | {:>18.0} | {:>8.2} / {:<8.2} | {:>9.2} / {:<9.2} | {rate:>17.0} | {:.2}",
            table_mib(&db).await,
            metrics.0,
            metrics.1,
            queues.0,
            queues.1,
            rate / base_rate
        );
        drop(process);
    }

    // Pruning the history: one coordinator, everything expired.
    let before = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    let process = CoordinatorProcess::start(&db, &coordinator_env(1, 100)).await;
    let base = process.api.base().to_owned();
    // Until all of it is gone, or for at most a minute.
    let window = Duration::from_secs(60);
    let started = Instant::now();
    let mut pruned = 0.0;
    while pruned < before as f64 && started.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(100)).await;
        pruned = metric_sum(&http, &base, "runlease_jobs_pruned_total").await;
    }
    let elapsed = started.elapsed().as_secs_f64();
    drop(process);
    println!(
        "prune of expired history ({before} jobs in the table, RUNLEASE_PRUNE_BATCH 1000): {pruned:.0} deleted in {elapsed:.1} s = {:.0} jobs/s",
        pruned / elapsed
    );

    // Pruning beside a sustained drain, on a fresh database: every job
    // expires a second after it finishes.
    drop(db);
    let db = TestDb::new().await;
    let process = CoordinatorProcess::start(&db, &coordinator_env(1_000, 500)).await;
    let base = process.api.base().to_owned();
    let total = fresh * 5;
    enqueue(&http, &base, "sustained", total).await;
    let stop = CancellationToken::new();
    let started = Instant::now();
    let from = metric_sum(&http, &base, "runlease_jobs_pruned_total").await;
    let workers = start_workers(&base, "sustained", &stop);
    let mut most_terminal = 0;
    loop {
        let done = queue_count(&http, &base, "sustained", "done").await;
        most_terminal = most_terminal.max(done);
        let pruned = metric_sum(&http, &base, "runlease_jobs_pruned_total").await - from;
        if pruned as usize + done as usize >= total {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let drained = started.elapsed().as_secs_f64();
    stop.cancel();
    for w in workers {
        let _ = w.await;
    }
    let pruned_during = metric_sum(&http, &base, "runlease_jobs_pruned_total").await - from;
    // Then until the last expired job is gone.
    while queue_count(&http, &base, "sustained", "done").await > 0
        && started.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_gone = started.elapsed().as_secs_f64();
    println!(
        "sustained drain with retention 1 s: {total} jobs done at {:.0} jobs/s; pruned {:.0} jobs/s while it ran; \
         at most {most_terminal} done jobs in the table at once; all pruned {:.1} s after the drain ended",
        total as f64 / drained,
        pruned_during / drained,
        all_gone - drained
    );
    drop(process);
    Ok(())
}
