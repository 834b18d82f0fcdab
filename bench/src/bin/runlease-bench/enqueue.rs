//! `enqueue`: the batch enqueue rate. Each coordinator build as its own
//! process on a fresh database, `--jobs` jobs sent 1,000 per `POST
//! /v1/jobs/batch`, one request at a time over one keep-alive connection;
//! graphile-worker's `addJobs` of 1,000 per call, one call at a time, into
//! a fresh database of its own. Jobs/s over the whole enqueue; rounds
//! interleaved, the ratio to graphile-worker taken round by round.
//! Target: ≥ 1.0× graphile-worker's `addJobs` rate.

use std::path::Path;
use std::time::{Duration, Instant};

use runlease_tests::{CoordinatorProcess, TestDb};

use crate::drain::{Build, QUEUE, paired};
use crate::history::enqueue;
use crate::stats::median;

/// The target against graphile-worker.
const TARGET: f64 = 1.0;

/// `jobs` through `/v1/jobs/batch` of 1,000: jobs/s.
async fn runlease(build: &Build, jobs: usize) -> anyhow::Result<f64> {
    let db = TestDb::empty().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let env = [("RUNLEASE_DATABASE_URL", format!("{}{sep}sslmode=disable", db.url))];
    let mut process = CoordinatorProcess::start_binary(&build.binary, &db, &env).await;
    let base = process.api.base().to_owned();
    let http = reqwest::Client::builder()
        .http1_only()
        .timeout(Duration::from_secs(60))
        .build()?;
    // One small batch first, so the connection and the coordinator's pool
    // are warm, as graphile-worker's are after its migrations.
    enqueue(&http, &base, "bench-warm", 10).await;
    let started = Instant::now();
    enqueue(&http, &base, QUEUE, jobs).await;
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    process.terminate();
    if tokio::time::timeout(Duration::from_secs(20), process.child.wait())
        .await
        .is_err()
    {
        process.child.kill().await?;
    }
    Ok(rate)
}

/// Runs the rounds and prints the table.
pub async fn report(
    builds: &[Build],
    graphile: Option<&Path>,
    jobs: usize,
    rounds: usize,
) -> anyhow::Result<()> {
    if let Some(dir) = graphile {
        crate::graphile::ensure_installed(dir).await?;
    }
    let mut per_build: Vec<Vec<f64>> = vec![Vec::new(); builds.len()];
    let mut peer: Vec<f64> = Vec::new();
    for round in 1..=rounds {
        for (b, build) in builds.iter().enumerate() {
            let r = runlease(build, jobs).await?;
            eprintln!("  round {round}: {}: {r:.0} jobs/s", build.name);
            per_build[b].push(r);
        }
        if let Some(dir) = graphile {
            let r = crate::graphile::enqueue_rate(dir, jobs).await?;
            eprintln!("  round {round}: graphile-worker 0.17 addJobs: {r:.0} jobs/s");
            peer.push(r);
        }
    }
    println!(
        "runlease-bench enqueue: {jobs} jobs, 1,000 per request (POST /v1/jobs/batch) or per addJobs call, one at a time; medians of {rounds} interleaved rounds, the ratio taken round by round (median, range)\n"
    );
    println!("| system | enqueue jobs/s | × graphile-worker | target ≥ {TARGET:.1}× | rounds (jobs/s) |");
    println!("|---|---:|---:|---|---|");
    let list = |v: &[f64]| v.iter().map(|j| format!("{j:.0}")).collect::<Vec<_>>().join(", ");
    if !peer.is_empty() {
        println!(
            "| graphile-worker 0.17 (addJobs) | {:.0} | 1.00 | – | {} |",
            median(peer.clone()),
            list(&peer)
        );
    }
    for (b, build) in builds.iter().enumerate() {
        let (ratio, met) = match paired(&peer, &per_build[b]) {
            Some((m, lo, hi)) => (
                format!("{m:.2} ({lo:.2}–{hi:.2})"),
                if m >= TARGET { "met" } else { "not met" },
            ),
            None => ("–".to_owned(), "–"),
        };
        println!(
            "| {} (/v1/jobs/batch) | {:.0} | {ratio} | {met} | {} |",
            build.name,
            median(per_build[b].clone()),
            list(&per_build[b])
        );
    }
    Ok(())
}
