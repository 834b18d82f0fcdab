//! `--flow OLD_BINARY[,OLD_BINARY...]`: what flow control costs. In
//! interleaved rounds, each coordinator build (the given older releases and
//! this one, each as its own process over a database it migrated itself)
//! drains `--jobs` jobs of an unlimited queue with 256 outside HTTP workers;
//! then this build drains a queue with `max_running = 100`. Medians of the
//! rounds, and each build against this one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use runlease_client::Client;
use runlease_client::protocol::{QueueName, WorkerId};
use runlease_tests::{CoordinatorProcess, TestDb};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::history::enqueue;
use crate::stats::median;
use crate::throughput::lean_worker;

const WORKERS: usize = 256;
const CLAIM: u32 = 8;

/// Jobs of `queue` done, read from PostgreSQL (older builds have no
/// per-queue route).
async fn done(client: &tokio_postgres::Client, queue: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM jobs WHERE queue = $1 AND state = 'done'",
            &[&queue],
        )
        .await
        .unwrap()
        .get(0)
}

/// One drain: a fresh database migrated by `binary`, `jobs` jobs, 256
/// workers; jobs/s from the first claim to the last completion.
async fn drain(binary: &Path, jobs: usize, max_running: Option<i32>) -> f64 {
    let db = TestDb::empty().await;
    let env = vec![
        ("RUNLEASE_DATABASE_POOL_SIZE", "20".to_owned()),
        ("RUNLEASE_REDIS_URL", String::new()),
        ("RUST_LOG", "warn".to_owned()),
    ];
    let process = CoordinatorProcess::start_binary(binary, &db, &env).await;
    let base = process.api.base().to_owned();
    let http = reqwest::Client::new();
    if let Some(max) = max_running {
        let (status, body) = process
            .api
            .patch("/v1/queues/bench", &json!({"max_running": max}))
            .await;
        assert_eq!(status, 200, "{body}");
        // Every coordinator sees the limit within a second.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
    }
    enqueue(&http, &base, "bench", jobs).await;
    let client = db.client().await;
    let stop = CancellationToken::new();
    let api = Client::builder(&base)
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let started = Instant::now();
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            tokio::spawn(lean_worker(
                api.clone(),
                WorkerId::new(format!("bench-{w}")).unwrap(),
                QueueName::new("bench").unwrap(),
                CLAIM,
                false,
                stop.clone(),
            ))
        })
        .collect();
    while done(&client, "bench").await < jobs as i64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    for w in workers {
        let _ = w.await;
    }
    drop(process);
    rate
}

pub async fn report(older: &[PathBuf], jobs: usize, rounds: usize) -> anyhow::Result<()> {
    let this = runlease_tests::process::coordinator_binary();
    let mut builds: Vec<(String, PathBuf)> = older
        .iter()
        .map(|p| {
            (
                p.file_name()
                    .map_or("older".into(), |n| n.to_string_lossy().into_owned()),
                p.clone(),
            )
        })
        .collect();
    builds.push(("this build".to_owned(), this.clone()));
    let mut unlimited: Vec<Vec<f64>> = vec![Vec::new(); builds.len()];
    let mut limited = Vec::new();
    for round in 0..rounds {
        for (i, (name, binary)) in builds.iter().enumerate() {
            let rate = drain(binary, jobs, None).await;
            eprintln!("  round {}: {name}, unlimited queue: {rate:.0} jobs/s", round + 1);
            unlimited[i].push(rate);
        }
        let rate = drain(&this, jobs, Some(100)).await;
        eprintln!(
            "  round {}: this build, max_running = 100: {rate:.0} jobs/s",
            round + 1
        );
        limited.push(rate);
    }
    let this_median = median(unlimited.last().cloned().unwrap_or_default());
    println!(
        "{jobs} jobs, {WORKERS} outside HTTP workers claiming up to {CLAIM}, coordinator as its own process; medians of {rounds} interleaved rounds"
    );
    println!("build | queue | jobs/s | × this build's unlimited | rounds");
    for ((name, _), rates) in builds.iter().zip(&unlimited) {
        let m = median(rates.clone());
        let all: Vec<String> = rates.iter().map(|r| format!("{r:.0}")).collect();
        println!(
            "{name} | unlimited | {m:.0} | {:.3} | {}",
            m / this_median,
            all.join(", ")
        );
    }
    let m = median(limited.clone());
    let all: Vec<String> = limited.iter().map(|r| format!("{r:.0}")).collect();
    println!(
        "this build | max_running = 100 | {m:.0} | {:.3} | {}",
        m / this_median,
        all.join(", ")
    );
    Ok(())
}
