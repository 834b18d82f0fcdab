//! The producer: jobs enqueued at a steady rate while the faults happen.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{Value, json};

use crate::jobs;
use crate::soak::say;

/// Enqueues `jobs` jobs at `rate` per second in small batches, each through
/// the next coordinator; a batch that gets no answer is sent again (to the
/// next one) with the same idempotency keys until one accepts it. Answers
/// how long it took. The time of every acknowledged batch goes to `acks`.
pub async fn produce(
    urls: Vec<String>,
    acks: Arc<Mutex<Vec<Instant>>>,
    jobs: u64,
    rate: f64,
    stall_every: u64,
    t0: Instant,
) -> anyhow::Result<(Duration, Vec<String>)> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .build()?;
    let batch = ((rate / 10.0).ceil() as u64).clamp(1, 1000);
    let every = Duration::from_secs_f64(batch as f64 / rate);
    let started = Instant::now();
    let mut next_at = tokio::time::Instant::now();
    let mut target = 0;
    let mut n = 0;
    let mut said = Instant::now();
    let mut server_errors = Vec::new();
    while n < jobs {
        let end = (n + batch).min(jobs);
        let body = json!({
            "jobs": (n..end)
                .map(|i| json!({
                    "queue": jobs::queue(i),
                    "payload": jobs::payload(i, stall_every),
                    "max_attempts": jobs::MAX_ATTEMPTS,
                    "idempotency_key": jobs::idempotency_key(i),
                }))
                .collect::<Vec<Value>>()
        });
        let give_up = Instant::now() + Duration::from_secs(120);
        loop {
            let url = format!("{}/v1/jobs/batch", urls[target % urls.len()]);
            target += 1;
            let sent = http
                .post(&url)
                .json(&body)
                .timeout(Duration::from_secs(10))
                .send()
                .await;
            match sent {
                Ok(r) if r.status().as_u16() == 201 => {
                    acks.lock().unwrap().push(Instant::now());
                    break;
                }
                Ok(r) if r.status().is_server_error() && r.status().as_u16() != 503 => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    server_errors.push(format!("{url} answered {status}: {text}"));
                }
                Ok(r) if r.status().is_client_error() && r.status().as_u16() != 429 => {
                    let status = r.status();
                    let text = r.text().await.unwrap_or_default();
                    bail!("the coordinator refused an enqueue batch: {status} {text}");
                }
                _ if Instant::now() > give_up => {
                    bail!("no coordinator accepted jobs {n}..{end} within 120 s")
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        n = end;
        if said.elapsed() > Duration::from_secs(15) {
            say(t0, &format!("enqueued {n} of {jobs}"));
            said = Instant::now();
        }
        next_at += every;
        tokio::time::sleep_until(next_at).await;
    }
    Ok((started.elapsed(), server_errors))
}
