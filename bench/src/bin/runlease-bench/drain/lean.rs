//! The outside HTTP workers of a drain: bare protocol loops that claim up
//! to `--concurrency` leases and complete them all in one `POST /v1/finish`.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::{CLAIM_WAIT_MS, QUEUE};
use crate::h1::Conn;

/// A bare worker's claim of one queue.
#[derive(Clone, Copy, Serialize)]
pub(crate) struct ClaimBody<'a> {
    queues: [&'a str; 1],
    worker_id: &'a str,
    max_jobs: u32,
    wait_ms: u64,
}

impl<'a> ClaimBody<'a> {
    /// A claim of up to `max_jobs` on `queue`, parking up to `wait_ms`.
    pub(crate) fn new(queue: &'a str, worker_id: &'a str, max_jobs: u32, wait_ms: u64) -> Self {
        Self {
            queues: [queue],
            worker_id,
            max_jobs,
            wait_ms,
        }
    }

    /// The same claim riding a finish: it does not wait.
    pub(crate) fn riding(&self) -> Self {
        Self { wait_ms: 0, ..*self }
    }
}

#[derive(Serialize)]
struct FinishItemBody<'a> {
    lease_token: &'a str,
    action: &'static str,
}

/// A finish completing leases, with the next claim on it or not.
#[derive(Serialize)]
pub(crate) struct FinishBody<'a> {
    items: Vec<FinishItemBody<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<&'a ClaimBody<'a>>,
}

impl<'a> FinishBody<'a> {
    /// Completes every lease of `tokens`, with `claim` riding on it.
    pub(crate) fn completing(
        tokens: impl Iterator<Item = &'a str>,
        claim: Option<&'a ClaimBody<'a>>,
    ) -> Self {
        let items = tokens
            .map(|lease_token| FinishItemBody {
                lease_token,
                action: "complete",
            })
            .collect();
        Self { items, claim }
    }
}

#[derive(Deserialize)]
pub(crate) struct LeaseAnswer {
    pub(crate) lease_token: String,
}

/// What a claim answers, as far as a bare worker reads it.
#[derive(Deserialize)]
pub(crate) struct ClaimAnswer {
    pub(crate) leases: Vec<LeaseAnswer>,
}

#[derive(Deserialize)]
pub(crate) struct FinishItemAnswer {
    status: String,
}

/// What a finish answers, as far as a bare worker reads it.
#[derive(Deserialize)]
pub(crate) struct FinishAnswer {
    items: Vec<FinishItemAnswer>,
    #[serde(default)]
    leases: Option<Vec<LeaseAnswer>>,
}

impl FinishAnswer {
    /// Items answered ok.
    pub(crate) fn ok(&self) -> usize {
        self.items.iter().filter(|i| i.status == "ok").count()
    }

    /// The tokens of the leases its claim got.
    pub(crate) fn next_tokens(self) -> Vec<String> {
        self.leases
            .unwrap_or_default()
            .into_iter()
            .map(|l| l.lease_token)
            .collect()
    }
}

/// What the workers share: completions seen, requests sent, and when the
/// last completion was answered.
pub(crate) struct Progress {
    pub(crate) target: usize,
    pub(crate) ok: AtomicUsize,
    pub(crate) requests: AtomicU64,
    pub(crate) done_at: OnceLock<Instant>,
    /// A finish the coordinator refused (4xx): the run cannot end.
    pub(crate) refused: OnceLock<String>,
    pub(crate) done: tokio::sync::Notify,
}

/// Outside HTTP workers draining [`QUEUE`]: started together, waited for
/// until every job is done, then stopped.
pub(crate) struct Fleet {
    pub(crate) progress: Arc<Progress>,
    /// When the workers were started.
    pub(crate) started: Instant,
    stop: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<Vec<f64>>>,
}

impl Fleet {
    /// Starts `workers` workers, each on one of `bases` in turn, claiming
    /// up to `concurrency` (riding finishes when `ride`), until `target`
    /// jobs are done.
    pub(crate) fn start(
        bases: &[Arc<str>],
        workers: usize,
        concurrency: u32,
        ride: bool,
        target: usize,
    ) -> Self {
        let progress = Arc::new(Progress {
            target,
            ok: AtomicUsize::new(0),
            requests: AtomicU64::new(0),
            done_at: OnceLock::new(),
            refused: OnceLock::new(),
            done: tokio::sync::Notify::new(),
        });
        let stop = CancellationToken::new();
        let started = Instant::now();
        let handles = (0..workers)
            .map(|w| {
                tokio::spawn(worker(
                    bases[w % bases.len()].clone(),
                    format!("bench-{w}"),
                    concurrency,
                    ride,
                    progress.clone(),
                    stop.clone(),
                ))
            })
            .collect();
        Self {
            progress,
            started,
            stop,
            handles,
        }
    }

    /// Waits until every job is done, 10 minutes at most; answers when the
    /// last completion was answered. An error names `build` when a finish
    /// was refused or the time ran out.
    pub(crate) async fn finished(&self, build: &str) -> anyhow::Result<Instant> {
        let progress = &self.progress;
        let waited = tokio::time::timeout(std::time::Duration::from_secs(600), async {
            while progress.done_at.get().is_none() && progress.refused.get().is_none() {
                progress.done.notified().await;
            }
        })
        .await;
        if let Some(refused) = progress.refused.get() {
            anyhow::bail!("{build}: {refused}");
        }
        anyhow::ensure!(
            waited.is_ok(),
            "{build}: {} of {} jobs done after 10 minutes",
            progress.ok.load(Ordering::Relaxed),
            progress.target
        );
        Ok(*progress.done_at.get().expect("set before the notification"))
    }

    /// Stops the workers; answers every claim→complete time they saw (ms).
    pub(crate) async fn stop(self) -> anyhow::Result<Vec<f64>> {
        self.stop.cancel();
        let mut claim_to_complete = Vec::new();
        for h in self.handles {
            claim_to_complete.extend(h.await?);
        }
        Ok(claim_to_complete)
    }
}

/// Does `base` answer a finish carrying `claim` with `leases`? Found out on
/// one probe job of its own queue, which ends done either way.
pub(crate) async fn rides(http: &reqwest::Client, base: &str) -> anyhow::Result<bool> {
    let queue = "bench-probe";
    let status = http
        .post(format!("{base}/v1/jobs"))
        .json(&json!({"queue": queue, "payload": null}))
        .send()
        .await?
        .status();
    anyhow::ensure!(status.is_success(), "probe enqueue answered {status}");
    let claim = json!({"queues": [queue], "worker_id": "bench-probe", "max_jobs": 1, "wait_ms": 5_000});
    let answer: Value = http
        .post(format!("{base}/v1/claim"))
        .json(&claim)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let token = answer["leases"][0]["lease_token"].clone();
    anyhow::ensure!(token.is_string(), "probe claim answered {answer}");
    let items = json!([{"lease_token": token, "action": "complete"}]);
    let mut ride = claim.clone();
    ride["wait_ms"] = json!(0);
    let response = http
        .post(format!("{base}/v1/finish"))
        .json(&json!({"items": items, "claim": ride}))
        .send()
        .await?;
    if response.status().is_success() {
        let body: Value = response.json().await?;
        anyhow::ensure!(body["items"][0]["status"] == "ok", "probe finish answered {body}");
        return Ok(body.get("leases").is_some_and(Value::is_array));
    }
    // An older build refuses the unknown field; finish the probe without it.
    let body: Value = http
        .post(format!("{base}/v1/finish"))
        .json(&json!({"items": items}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    anyhow::ensure!(body["items"][0]["status"] == "ok", "probe finish answered {body}");
    Ok(false)
}

/// A bare worker until `stop`: claim up to `max_jobs`, complete them in one
/// finish (with the next claim on it when `ride`), over a connection of its
/// own ([`Conn`]). Answers its claim→complete latencies (ms).
pub(crate) async fn worker(
    base: Arc<str>,
    id: String,
    max_jobs: u32,
    ride: bool,
    progress: Arc<Progress>,
    stop: CancellationToken,
) -> Vec<f64> {
    let claim = ClaimBody::new(QUEUE, &id, max_jobs, CLAIM_WAIT_MS);
    let ride_claim = claim.riding();
    let claim_body = serde_json::to_vec(&claim).expect("a claim serializes");
    let mut conn = Conn::new(&base);
    let mut body = Vec::new();
    let mut held: Vec<String> = Vec::new();
    let mut claimed_at = Instant::now();
    let mut latencies = Vec::new();
    loop {
        if held.is_empty() {
            progress.requests.fetch_add(1, Ordering::Relaxed);
            let answer = tokio::select! {
                () = stop.cancelled() => return latencies,
                r = conn.post("/v1/claim", &claim_body) => r,
            };
            let Ok(answer) = answer else { continue };
            let Ok(answer) = serde_json::from_slice::<ClaimAnswer>(answer.body) else {
                continue;
            };
            claimed_at = Instant::now();
            held = answer.leases.into_iter().map(|l| l.lease_token).collect();
            if held.is_empty() {
                continue;
            }
        }
        let finish = FinishBody::completing(held.iter().map(String::as_str), ride.then_some(&ride_claim));
        body.clear();
        serde_json::to_writer(&mut body, &finish).expect("a finish serializes");
        progress.requests.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::select! {
            () = stop.cancelled() => return latencies,
            r = conn.post("/v1/finish", &body) => r,
        };
        // A finish is safe to repeat with the same tokens: go round again.
        let Ok(answer) = answer else { continue };
        if (400..500).contains(&answer.status) {
            let text = String::from_utf8_lossy(answer.body);
            let _ = progress
                .refused
                .set(format!("a finish answered {}: {text}", answer.status));
            progress.done.notify_one();
            return latencies;
        }
        if !answer.is_success() {
            continue;
        }
        let Ok(answer) = serde_json::from_slice::<FinishAnswer>(answer.body) else {
            continue;
        };
        let now = Instant::now();
        let ok = answer.ok();
        let ms = (now - claimed_at).as_secs_f64() * 1e3;
        latencies.extend(std::iter::repeat_n(ms, ok));
        if progress.ok.fetch_add(ok, Ordering::Relaxed) + ok >= progress.target {
            let _ = progress.done_at.set(now);
            progress.done.notify_one();
        }
        held = answer.next_tokens();
        claimed_at = now;
    }
}
