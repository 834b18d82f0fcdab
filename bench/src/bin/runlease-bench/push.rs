//! `drain --push`: the same preloaded queue drained by pushes to an HTTP
//! endpoint instead of pull workers, and the latency of a push at a steady
//! offered rate.
//!
//! The coordinator runs as its own process on a fresh database (its default
//! settings, `RUNLEASE_ENDPOINT_ALLOW_HOSTS=127.0.0.1`); the endpoint is in
//! this process: HTTP/1.1 with keep-alive on 127.0.0.1, answering every push
//! `200 {}` at once (nothing verified: it measures the coordinator).
//!
//! - **Drain**: `jobs` jobs enqueued 1,000 per batch, counters settled, then
//!   the queue's endpoint is set (`concurrency` requests in flight); the
//!   drain ends when the queue's figures count every job done. jobs/s, and
//!   PostgreSQL transactions per job over the drain (`pg_stat_database`,
//!   read after the coordinator exited).
//! - **Latency**: a second queue served by the endpoint, jobs enqueued one
//!   request of 5 every 10 ms (500 jobs/s offered) for `latency_s` seconds;
//!   each job's payload holds when its enqueue was sent, and the endpoint
//!   takes the time a push arrives: enqueue→request p50/p99.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runlease_tests::{CoordinatorProcess, TestDb};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

use crate::history::enqueue;
use crate::stats::{backends_gone, counters_settled, percentile};

const DRAIN_QUEUE: &str = "bench-push";
const LATENCY_QUEUE: &str = "bench-push-latency";
const SETTLE: Duration = Duration::from_secs(11);

/// What the endpoint saw.
struct Seen {
    /// The bench's clock's origin: payloads carry µs since it.
    epoch: Instant,
    pushes: AtomicUsize,
    /// enqueue sent → push arrived, ms (latency jobs only).
    latencies: Mutex<Vec<f64>>,
}

/// What one push run measured.
pub struct PushRun {
    /// Drain jobs/s.
    pub jobs_per_s: f64,
    /// PostgreSQL transactions per job over the drain.
    pub xacts: f64,
    /// Enqueue→request ms at the offered rate: p50, p99.
    pub latency: (f64, f64),
    /// Jobs offered for the latency.
    pub offered: usize,
}

/// Serves pushes on 127.0.0.1 until the process ends; answers its address.
async fn endpoint(seen: Arc<Seen>) -> anyhow::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(connection(stream, seen.clone()));
        }
    });
    Ok(addr)
}

/// One keep-alive connection: request after request, each answered `200 {}`.
async fn connection(mut stream: TcpStream, seen: Arc<Seen>) {
    let _ = stream.set_nodelay(true);
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < head_end + length {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let arrived = seen.epoch.elapsed().as_secs_f64() * 1000.0;
        let body: Value = serde_json::from_slice(&buf[head_end..head_end + length]).unwrap_or(Value::Null);
        buf.drain(..head_end + length);
        seen.pushes.fetch_add(1, Ordering::Relaxed);
        if let Some(sent_us) = body["job"]["payload"]["sent_us"].as_f64() {
            seen.latencies.lock().await.push(arrived - sent_us / 1000.0);
        }
        let answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        if stream.write_all(answer).await.is_err() {
            return;
        }
    }
}

async fn set_endpoint(
    http: &reqwest::Client,
    base: &str,
    queue: &str,
    url: &str,
    concurrency: usize,
) -> anyhow::Result<()> {
    let r = http
        .patch(format!("{base}/v1/queues/{queue}"))
        .json(&json!({"endpoint": {"url": url, "concurrency": concurrency}}))
        .send()
        .await?;
    anyhow::ensure!(
        r.status().is_success(),
        "setting the endpoint: {}",
        r.text().await?
    );
    Ok(())
}

async fn done(http: &reqwest::Client, base: &str, queue: &str) -> anyhow::Result<i64> {
    let body: Value = http
        .get(format!("{base}/v1/queues/{queue}"))
        .send()
        .await?
        .json()
        .await?;
    Ok(body["counts"]["done"].as_i64().unwrap_or(0))
}

/// Waits until `n` jobs of `queue` are done (10 minutes at most); answers when.
async fn until_done(http: &reqwest::Client, base: &str, queue: &str, n: usize) -> anyhow::Result<Instant> {
    let started = Instant::now();
    loop {
        if done(http, base, queue).await? as usize >= n {
            return Ok(Instant::now());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "{queue}: not every job done after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One push drain of `jobs` with `concurrency` requests in flight, then
/// `latency_s` seconds of 500 jobs/s offered, on `binary`.
pub async fn run(
    binary: &std::path::Path,
    jobs: usize,
    concurrency: usize,
    latency_s: u64,
) -> anyhow::Result<PushRun> {
    let seen = Arc::new(Seen {
        epoch: Instant::now(),
        pushes: AtomicUsize::new(0),
        latencies: Mutex::new(Vec::new()),
    });
    let addr = endpoint(seen.clone()).await?;
    let url = format!("http://{addr}/");
    let db = TestDb::empty().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let env = [
        ("RUNLEASE_DATABASE_URL", format!("{}{sep}sslmode=disable", db.url)),
        ("RUNLEASE_ENDPOINT_ALLOW_HOSTS", "127.0.0.1".to_owned()),
    ];
    let mut process = CoordinatorProcess::start_binary(binary, &db, &env).await;
    let base = process.api.base().to_owned();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;

    enqueue(&http, &base, DRAIN_QUEUE, jobs).await;
    let before = counters_settled(&db.name, SETTLE).await;
    let started = Instant::now();
    set_endpoint(&http, &base, DRAIN_QUEUE, &url, concurrency).await?;
    // Counted in this process first, so the polls of the queue's figures
    // (transactions of their own) are few.
    while seen.pushes.load(Ordering::Relaxed) < jobs {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "{} of {jobs} pushes after 10 minutes",
            seen.pushes.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let finished = until_done(&http, &base, DRAIN_QUEUE, jobs).await?;
    let jobs_per_s = jobs as f64 / (finished - started).as_secs_f64();
    // The transactions of the drain alone: settled before the latency phase.
    let after = counters_settled(&db.name, SETTLE).await;
    let xacts = (after.xacts - before.xacts) as f64 / jobs as f64;

    set_endpoint(&http, &base, LATENCY_QUEUE, &url, concurrency).await?;
    let offered = (latency_s * 500) as usize;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for _ in 0..offered / 5 {
        tick.tick().await;
        let sent_us = seen.epoch.elapsed().as_secs_f64() * 1e6;
        let batch: Vec<Value> = (0..5)
            .map(|_| json!({"queue": LATENCY_QUEUE, "payload": {"sent_us": sent_us}}))
            .collect();
        let http = http.clone();
        let base = base.clone();
        // Sent without waiting for the answer, so a slow one does not
        // lower the rate offered.
        tokio::spawn(async move {
            let _ = http
                .post(format!("{base}/v1/jobs/batch"))
                .json(&json!({"jobs": batch}))
                .send()
                .await;
        });
    }
    until_done(&http, &base, LATENCY_QUEUE, offered).await?;
    let mut latencies = seen.latencies.lock().await.clone();
    latencies.sort_by(f64::total_cmp);

    process.terminate();
    if tokio::time::timeout(Duration::from_secs(20), process.child.wait())
        .await
        .is_err()
    {
        process.child.kill().await?;
    }
    backends_gone(&db.name).await;
    Ok(PushRun {
        jobs_per_s,
        xacts,
        latency: (percentile(&latencies, 0.5), percentile(&latencies, 0.99)),
        offered,
    })
}
