//! `graph`: a fan-out/fan-in of dependent jobs drained through HTTP, against
//! a plain drain of as many independent jobs, in the same run.
//!
//! The graph of `--jobs` N: one root; leaves that each wait on the root;
//! `--fan-in` merges, each waiting on its share of the leaves (at most 100,
//! the most a job may wait on); one final job waiting on every merge. It is
//! enqueued through `POST /v1/jobs/batch` (1,000 jobs per request, leaves
//! and merges naming their dependencies by id), not timed. Then the same
//! outside HTTP workers as `drain` (claim up to `--concurrency`, complete
//! them in one `/v1/finish`, the next claim riding it) run every job; the
//! time is from the workers' start to the last completion answered. A job
//! becomes claimable only when the statement that ended its last
//! dependency queued it, so the graph runs in four waves (root, leaves,
//! merges, final), the last three each started by the one before.
//!
//! The plain drain is the same count of jobs without dependencies, on a
//! fresh database and coordinator of the same build. Rounds interleave the
//! two; the report is each round's jobs/s and the ratio graph / plain, then
//! the medians (target: ≥ 0.7×).

use std::sync::Arc;
use std::time::Duration;

use runlease_tests::{CoordinatorProcess, TestDb};
use serde_json::{Value, json};

use crate::drain::{Build, Fleet, QUEUE, rides};
use crate::history::enqueue;
use crate::stats::median;

/// The most dependencies a job may name.
const MAX_DEPENDENCIES: usize = 100;
/// Jobs per enqueue request.
const BATCH: usize = 1_000;

/// What one round measured: jobs/s of the plain drain and of the graph,
/// and the graph's jobs' wait from their last dependency's end to their
/// claim (ms, p50 and max).
struct Round {
    plain: f64,
    graph: f64,
    wait: (f64, f64),
}

/// For every job with dependencies: its claim's time after the end of its
/// last dependency, ms (p50, max), from the rows.
async fn waits(db: &TestDb) -> anyhow::Result<(f64, f64)> {
    let row = db
        .client()
        .await
        .query_one(
            "SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY w), 0)::float8,
                    coalesce(max(w), 0)::float8
             FROM (SELECT extract(epoch FROM j.claimed_at - max(d.finished_at)) * 1000 AS w
                   FROM jobs j
                   JOIN job_dependencies e ON e.job_id = j.id
                   JOIN jobs d ON d.id = e.depends_on_id
                   WHERE j.queue = $1
                   GROUP BY j.id, j.claimed_at) t",
            &[&QUEUE],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// Enqueues the graph of `n` jobs with `merges` merges; answers its count.
async fn enqueue_graph(http: &reqwest::Client, base: &str, n: usize, merges: usize) -> anyhow::Result<usize> {
    anyhow::ensure!(
        merges >= 1 && n >= merges + 3,
        "--jobs must exceed --fan-in by at least 3"
    );
    let leaves = n - merges - 2;
    let per_merge = leaves.div_ceil(merges);
    anyhow::ensure!(
        per_merge <= MAX_DEPENDENCIES && merges <= MAX_DEPENDENCIES,
        "a merge would wait on {per_merge} leaves and the final job on {merges} merges: at most {MAX_DEPENDENCIES} each (raise or lower --fan-in)"
    );
    let post = |jobs: Vec<Value>| async move {
        let answer: Value = http
            .post(format!("{base}/v1/jobs/batch"))
            .json(&json!({"jobs": jobs}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let ids: Vec<String> = answer["jobs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|j| j["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        anyhow::Ok(ids)
    };
    let root = post(vec![json!({"queue": QUEUE, "payload": "root"})]).await?;
    let root = root
        .first()
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("the root was not answered"))?;
    let mut leaf_ids = Vec::with_capacity(leaves);
    for start in (0..leaves).step_by(BATCH) {
        let jobs = (start..(start + BATCH).min(leaves))
            .map(|i| json!({"queue": QUEUE, "payload": i, "depends_on": [root]}))
            .collect();
        leaf_ids.extend(post(jobs).await?);
    }
    let mut merge_ids = Vec::with_capacity(merges);
    // Ten merges (up to 1,000 dependency ids) per request.
    for group in leaf_ids.chunks(per_merge).collect::<Vec<_>>().chunks(10) {
        let jobs = group
            .iter()
            .map(|deps| json!({"queue": QUEUE, "payload": "merge", "depends_on": deps}))
            .collect();
        merge_ids.extend(post(jobs).await?);
    }
    post(vec![
        json!({"queue": QUEUE, "payload": "final", "depends_on": merge_ids}),
    ])
    .await?;
    Ok(1 + leaf_ids.len() + merge_ids.len() + 1)
}

/// One drain of `jobs` on a fresh database and coordinator of `build`, the
/// jobs as a graph or plain; answers jobs/s.
async fn drain(
    build: &Build,
    workers: usize,
    jobs: usize,
    merges: usize,
    concurrency: u32,
    graph: bool,
) -> anyhow::Result<(f64, (f64, f64))> {
    let db = TestDb::empty().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let env = [("RUNLEASE_DATABASE_URL", format!("{}{sep}sslmode=disable", db.url))];
    let process = CoordinatorProcess::start_binary(&build.binary, &db, &env).await;
    let base: Arc<str> = process.api.base().into();
    let http = reqwest::Client::builder()
        .http1_only()
        .timeout(Duration::from_secs(30))
        .build()?;
    let ride = rides(&http, &base).await?;
    let target = if graph {
        enqueue_graph(&http, &base, jobs, merges).await?
    } else {
        enqueue(&http, &base, QUEUE, jobs).await;
        jobs
    };
    let fleet = Fleet::start(std::slice::from_ref(&base), workers, concurrency, ride, target);
    let done_at = fleet.finished(&build.name).await;
    let started = fleet.started;
    fleet.stop().await?;
    let elapsed = done_at? - started;
    let done: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM jobs WHERE queue = $1 AND state = 'done'",
            &[&QUEUE],
        )
        .await?
        .get(0);
    anyhow::ensure!(
        done as usize == target,
        "{}: {done} of {target} jobs done",
        build.name
    );
    process.terminate();
    let wait = if graph { waits(&db).await? } else { (0.0, 0.0) };
    Ok((target as f64 / elapsed.as_secs_f64(), wait))
}

/// The `graph` subcommand: `repeat` rounds of a plain drain and a graph of
/// `jobs`, then the medians.
pub async fn run(
    build: &Build,
    workers: usize,
    jobs: usize,
    merges: usize,
    concurrency: u32,
    repeat: usize,
) -> anyhow::Result<()> {
    println!(
        "graph: {jobs} jobs (1 root, leaves, {merges} merges, 1 final) against {jobs} plain jobs; {workers} workers claiming up to {concurrency}; build {} ({})",
        build.name,
        build.binary.display()
    );
    println!(
        "{:>5} {:>12} {:>12} {:>8}   graph: from a job's last dependency's end to its claim, ms p50 / max",
        "round", "plain jobs/s", "graph jobs/s", "ratio"
    );
    let mut rounds = Vec::with_capacity(repeat);
    for r in 1..=repeat {
        let (plain, _) = drain(build, workers, jobs, merges, concurrency, false).await?;
        let (graph, wait) = drain(build, workers, jobs, merges, concurrency, true).await?;
        println!(
            "{r:>5} {plain:>12.0} {graph:>12.0} {:>7.2}x   {:.1} / {:.1}",
            graph / plain,
            wait.0,
            wait.1
        );
        rounds.push(Round { plain, graph, wait });
    }
    let plain = median(rounds.iter().map(|r| r.plain).collect());
    let graph = median(rounds.iter().map(|r| r.graph).collect());
    let ratios = median(rounds.iter().map(|r| r.graph / r.plain).collect());
    let wait = median(rounds.iter().map(|r| r.wait.0).collect());
    println!(
        "median {plain:>11.0} {graph:>12.0} {ratios:>7.2}x   {wait:.1} p50   (target: graph >= 0.7x plain)"
    );
    Ok(())
}
