//! Wake latency between two coordinators: a claim parked on B, a job
//! enqueued through A; the time from sending the enqueue to B's answer.

use std::time::{Duration, Instant};

use anyhow::bail;
use runlease_tests::{TestCoordinator, TestDb, TestRedis};
use serde_json::json;

use crate::stats::percentile;

async fn measure(rounds: usize, redis: &TestRedis, db: &TestDb) -> anyhow::Result<(f64, f64)> {
    let url = redis.url();
    let start = |url: String| TestCoordinator::start_with(db, move |cfg| cfg.redis.url = url);
    let a = start(url.clone()).await;
    let b = start(url).await;
    // Let both subscriptions come up (when Redis is up at all).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds {
        let api_b = b.api.clone();
        let parked = tokio::spawn(async move {
            let leases = api_b.claim_wait("wake", "bench-b", 1, 10_000).await;
            (leases, Instant::now())
        });
        // Give the claim time to park (its first look finds nothing).
        tokio::time::sleep(Duration::from_millis(30)).await;
        let sent = Instant::now();
        a.api.enqueue("wake", json!(i)).await;
        let (leases, answered) = parked.await?;
        if leases.is_empty() {
            bail!("round {i}: the parked claim answered empty");
        }
        b.api.complete(&leases[0], json!(null)).await;
        samples.push(answered.duration_since(sent).as_secs_f64() * 1000.0);
    }
    samples.sort_by(f64::total_cmp);
    a.stop().await?;
    b.stop().await?;
    Ok((percentile(&samples, 0.5), percentile(&samples, 0.99)))
}

pub async fn report(rounds: usize) -> anyhow::Result<()> {
    let mut redis = TestRedis::start().await;
    let db = TestDb::new().await;
    let (p50, p99) = measure(rounds, &redis, &db).await?;
    println!("wake latency, enqueue on coordinator A → parked claim answered on B, {rounds} rounds");
    println!("  with Redis:             p50 {p50:>8.1} ms   p99 {p99:>8.1} ms");
    redis.stop();
    let (p50, p99) = measure(rounds, &redis, &db).await?;
    println!(
        "  Redis stopped (timer):  p50 {p50:>8.1} ms   p99 {p99:>8.1} ms   (RUNLEASE_CLAIM_RECHECK_MS 1000, jittered ±25%)"
    );
    Ok(())
}
