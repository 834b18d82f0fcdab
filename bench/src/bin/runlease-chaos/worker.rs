//! `runlease-chaos worker`: a worker process speaking the protocol over
//! plain HTTP (claim, heartbeat, complete, fail, release), which writes every
//! finishing answer it got to its own log, one JSON line each, before it
//! does anything else: job id, run lease, action, the answer, and the result
//! it landed. The soak checks those lines against the database.
//!
//! It deliberately does not fence itself when a heartbeat is lost or the
//! coordinator is out of reach: a stalled or partitioned worker goes on to
//! finish, so the coordinator's guard is what stands between a stale result
//! and the job.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use runlease_protocol::worker::{ClaimResponse, Lease};
use serde_json::{Value, json};

use crate::jobs::{self, Kind, Rng};

/// The worker mode's settings.
pub struct WorkerArgs {
    /// Coordinator (or proxy) base URL.
    pub coordinator: String,
    /// Where acknowledged outcomes go (appended).
    pub log: std::path::PathBuf,
    /// The worker id it claims under.
    pub id: String,
    /// Jobs it holds at once.
    pub concurrency: usize,
    /// The handler's run time, ms, drawn from `lo..=hi` per job.
    pub work_ms: (u64, u64),
}

/// How long a finishing call is retried (transport errors, 5xx) before the
/// worker gives up and logs the outcome as unknown.
pub const FINISH_PERSISTENCE: Duration = Duration::from_secs(90);

/// A line-per-write log: each record is one `write` on an append-only file,
/// so a SIGKILL loses at most the record being written, never a neighbour.
#[derive(Clone)]
pub struct Log(Arc<Mutex<File>>);

impl Log {
    /// `path`, opened for appending (created when missing).
    pub fn open(path: &std::path::Path) -> anyhow::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        Ok(Self(Arc::new(Mutex::new(file))))
    }

    /// Appends `record` as one line.
    pub fn write(&self, record: &Value) {
        let mut line = record.to_string();
        line.push('\n');
        if let Ok(mut f) = self.0.lock() {
            // A log that cannot be written makes the verification fail loudly
            // (acknowledgements missing is not what it tolerates silently).
            if let Err(e) = f.write_all(line.as_bytes()) {
                eprintln!("cannot write the outcome log: {e}");
                std::process::exit(3);
            }
        }
    }
}

struct Worker {
    http: reqwest::Client,
    base: String,
    id: String,
    log: Log,
}

/// Runs until killed.
pub async fn run(args: WorkerArgs) -> anyhow::Result<()> {
    let log = Log::open(&args.log)?;
    let worker = Arc::new(Worker {
        http: reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .pool_idle_timeout(Duration::from_secs(20))
            .build()?,
        base: args.coordinator.trim_end_matches('/').to_owned(),
        id: args.id.clone(),
        log,
    });
    let seed = jobs::splitmix64(args.id.bytes().fold(0u64, |h, b| h.rotate_left(5) ^ u64::from(b)));
    let mut slots = tokio::task::JoinSet::new();
    for slot in 0..args.concurrency {
        let worker = worker.clone();
        let work_ms = args.work_ms;
        slots.spawn(async move {
            let mut rng = Rng::new(seed ^ slot as u64);
            loop {
                for lease in worker.claim().await {
                    let ms = rng.between(work_ms.0, work_ms.1);
                    worker.run_one(lease, Duration::from_millis(ms)).await;
                }
            }
        });
    }
    while slots.join_next().await.is_some() {}
    Ok(())
}

impl Worker {
    async fn post(&self, path: &str, body: &Value, timeout: Duration) -> Result<(u16, Value), String> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .json(body)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let body = response.json::<Value>().await.unwrap_or(Value::Null);
        if status >= 500 && status != 503 {
            // 503 is the database being out of reach; any other 5xx is a bug
            // the report counts.
            self.log.write(&json!({"event": "server_error", "path": path, "http": status, "answer": body, "worker": self.id}));
        }
        Ok((status, body))
    }

    /// One claim (parks up to 2 s); empty on any failure, after a short pause.
    async fn claim(&self) -> Vec<Lease> {
        let body = json!({"queues": [jobs::QUEUE], "worker_id": self.id, "max_jobs": 1, "wait_ms": 2000});
        match self.post("/v1/claim", &body, Duration::from_secs(8)).await {
            Ok((200, body)) => match serde_json::from_value::<ClaimResponse>(body) {
                Ok(r) => r.leases,
                Err(e) => {
                    eprintln!("{}: claim answer unreadable: {e}", self.id);
                    Vec::new()
                }
            },
            Ok((status, body)) => {
                if status < 500 {
                    eprintln!("{}: claim answered {status}: {body}", self.id);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                Vec::new()
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Vec::new()
            }
        }
    }

    async fn run_one(&self, lease: Lease, work: Duration) {
        let n = lease.payload["n"].as_u64().unwrap_or(u64::MAX);
        let kind = Kind::parse(lease.payload["kind"].as_str().unwrap_or(""));
        let first = lease.run_lease.0 == 1;
        let started = Instant::now();
        if kind == Kind::Stall && first {
            // No heartbeat: the lease lapses, the reaper re-queues the job,
            // another worker runs it; this finish must then be refused.
            tokio::time::sleep(Duration::from_millis(lease.lease_ttl_ms) * 2 + Duration::from_secs(1)).await;
        } else {
            let beats = tokio::spawn(heartbeat(
                self.http.clone(),
                self.base.clone(),
                lease.lease_token.as_str().to_owned(),
                Duration::from_millis(lease.heartbeat_interval_ms.max(50)),
            ));
            tokio::time::sleep(work).await;
            beats.abort();
        }
        let token = lease.lease_token.as_str();
        let (action, path, body) = match kind {
            Kind::Flaky if first => (
                "fail",
                "/v1/fail",
                json!({"lease_token": token, "error": "flaky on its first lease", "retryable": true, "retry_after_ms": 50}),
            ),
            Kind::Release if first => ("release", "/v1/release", json!({"lease_token": token})),
            _ => (
                "complete",
                "/v1/complete",
                json!({"lease_token": token, "result": jobs::result(n, lease.run_lease.0, &self.id)}),
            ),
        };
        let (status, code, answer) = self.finish(path, &body).await;
        let mut record = json!({
            "job_id": lease.job_id.0,
            "run_lease": lease.run_lease.0,
            "n": n,
            "action": action,
            "status": status,
            "http": code,
            "held_ms": started.elapsed().as_millis() as u64,
            "worker": self.id,
        });
        if action == "complete" {
            record["result"] = body["result"].clone();
        }
        if status == "unexpected" {
            record["answer"] = answer;
        }
        self.log.write(&record);
    }

    /// Sends a finishing call until it gets a definite answer: 200 (`ok`),
    /// 409 (`refused`), another 4xx (`unexpected`), or nothing definite for
    /// [`FINISH_PERSISTENCE`] (`unknown`). Repeating it is safe: finishing is
    /// idempotent for its own lease.
    async fn finish(&self, path: &str, body: &Value) -> (&'static str, u16, Value) {
        let deadline = Instant::now() + FINISH_PERSISTENCE;
        loop {
            match self.post(path, body, Duration::from_secs(10)).await {
                Ok((200, answer)) => return ("ok", 200, answer),
                Ok((409, answer)) => return ("refused", 409, answer),
                Ok((status, answer)) if status < 500 && status != 429 => {
                    return ("unexpected", status, answer);
                }
                Ok((status, answer)) if Instant::now() >= deadline => return ("unknown", status, answer),
                Err(e) if Instant::now() >= deadline => return ("unknown", 0, Value::String(e)),
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// Renews one lease every `every` until aborted or told the lease is lost.
async fn heartbeat(http: reqwest::Client, base: String, token: String, every: Duration) {
    let body = json!({"leases": [{"lease_token": token}]});
    loop {
        tokio::time::sleep(every).await;
        let sent = http
            .post(format!("{base}/v1/heartbeat"))
            .json(&body)
            .timeout(Duration::from_secs(3))
            .send()
            .await;
        if let Ok(r) = sent
            && let Ok(answer) = r.json::<Value>().await
            && answer["leases"][0]["status"] == json!("lease_lost")
        {
            return;
        }
    }
}
