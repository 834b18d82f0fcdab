//! Scale of waiting: N workers parked in long-poll claims on one coordinator
//! process. Reports the coordinator's PostgreSQL connections and resident
//! memory while they wait, then how long one batch of N jobs takes to reach
//! them all. Each claim has an HTTP/1.1 connection of its own (workers
//! apart), or with `--http2` is a stream of an HTTP/2 connection carrying
//! [`STREAMS_PER_CONNECTION`] of them (a proxy in front of the coordinator
//! that multiplexes its clients' requests).

use std::time::{Duration, Instant};

use runlease_client::Client;
use runlease_client::protocol::worker::ClaimRequest;
use runlease_client::protocol::{QueueName, WorkerId};
use runlease_tests::{CoordinatorProcess, TestDb, admin};
use serde_json::{Value, json};

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

async fn metric(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    // A scrape refused while the claims connect counts as none parked yet.
    let Ok(response) = client.get(format!("{base}/metrics")).send().await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// The coordinator's limit of concurrent streams per HTTP/2 connection.
const STREAMS_PER_CONNECTION: usize = 100;

/// One parked claim of worker `w` over `http` (an HTTP/2 client): the
/// leases it was answered.
async fn claim_h2(http: reqwest::Client, base: String, w: usize) -> anyhow::Result<usize> {
    let body =
        json!({"queues": ["parked"], "worker_id": format!("parked-{w}"), "max_jobs": 1, "wait_ms": 60_000});
    let answer: Value = http
        .post(format!("{base}/v1/claim"))
        .json(&body)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(answer["leases"].as_array().map_or(0, Vec::len))
}

pub async fn report(n: usize, http2: bool) -> anyhow::Result<()> {
    let db = TestDb::new().await;
    // Room for them all: a connection each (and a few more for the
    // scrapes), and as many parked claims, all of one caller (open mode).
    let process = CoordinatorProcess::start(
        &db,
        &[
            ("RUNLEASE_DATABASE_POOL_SIZE", "20".into()),
            ("RUNLEASE_REDIS_URL", String::new()),
            ("RUNLEASE_MAX_CONNECTIONS", (n + 256).max(16).to_string()),
            ("RUNLEASE_MAX_PARKED_CLAIMS", n.max(1).to_string()),
            ("RUNLEASE_MAX_PARKED_CLAIMS_PER_KEY", n.max(1).to_string()),
        ],
    )
    .await;
    let pid = process.child.id().unwrap_or(0);
    let base = process.api.base().to_owned();
    let client = Client::builder(&base).timeout(Duration::from_secs(120)).build()?;
    let idle_rss = rss_mib(pid);

    let mut parked = Vec::with_capacity(n);
    // One HTTP/2 client (one connection) per STREAMS_PER_CONNECTION claims.
    let mut h2 = None;
    for w in 0..n {
        if !http2 {
            let client = client.clone();
            parked.push(tokio::spawn(async move {
                let req = ClaimRequest {
                    queues: vec![QueueName::new("parked").unwrap()],
                    worker_id: WorkerId::new(format!("parked-{w}")).unwrap(),
                    max_jobs: 1,
                    wait_ms: 60_000,
                    time_left_ms: None,
                };
                Ok::<_, anyhow::Error>(client.claim(&req).await?.leases.len())
            }));
            continue;
        }
        if w % STREAMS_PER_CONNECTION == 0 {
            h2 = Some(
                reqwest::Client::builder()
                    .http2_prior_knowledge()
                    .timeout(Duration::from_secs(120))
                    .build()?,
            );
        }
        let http = h2.clone().expect("made at the first claim");
        parked.push(tokio::spawn(claim_h2(http, base.clone(), w)));
    }
    let http = reqwest::Client::new();
    let started = Instant::now();
    while metric(&http, &base, "runlease_claim_waiters").await < n as f64 {
        if started.elapsed() > Duration::from_secs(50) {
            anyhow::bail!(
                "only {} of {n} claims parked",
                metric(&http, &base, "runlease_claim_waiters").await
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let admin = admin().await;
    let connections: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
            &[&db.name],
        )
        .await?
        .get(0);
    let rss = rss_mib(pid);
    let framing = if http2 {
        format!(
            "HTTP/2, {} connections of up to {STREAMS_PER_CONNECTION} streams",
            n.div_ceil(STREAMS_PER_CONNECTION)
        )
    } else {
        "HTTP/1.1, a connection each".to_owned()
    };
    println!("{n} claims parked on one coordinator (pool size 20; {framing}):");
    println!("  PostgreSQL connections of its database: {connections}");
    println!(
        "  coordinator resident memory: {rss:.0} MiB (idle before: {idle_rss:.0} MiB), {:.1} KiB per parked claim",
        (rss - idle_rss) * 1024.0 / n.max(1) as f64
    );

    let started = Instant::now();
    for chunk in 0..n.div_ceil(1000) {
        let count = (n - chunk * 1000).min(1000);
        let jobs: Vec<Value> = (0..count)
            .map(|i| json!({"queue": "parked", "payload": i}))
            .collect();
        http.post(format!("{base}/v1/jobs/batch"))
            .json(&json!({"jobs": jobs}))
            .send()
            .await?
            .error_for_status()?;
    }
    let mut served = 0;
    for p in parked {
        let answered: anyhow::Result<usize> = p.await?;
        served += answered.unwrap_or(0);
    }
    println!(
        "  {n} jobs enqueued → all {served} parked claimers answered in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
