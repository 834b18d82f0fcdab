//! A JSON-over-HTTP caller for tests: every call returns the status and the
//! parsed body, so tests assert on exactly what a client would see.

use std::time::Duration;

use runlease_protocol::producer::EnqueueJobRequest;
use runlease_protocol::worker::{ClaimRequest, Lease};
use runlease_protocol::{Job, QueueName, WorkerId};
use serde_json::{Value, json};

/// Calls one coordinator.
#[derive(Clone)]
pub struct Api {
    base: String,
    http: reqwest::Client,
    key: Option<String>,
}

impl Api {
    /// A caller for `base` (e.g. `http://127.0.0.1:1234`).
    pub fn new(base: String) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(90))
            .build()
            .expect("reqwest client");
        Self {
            base,
            http,
            key: None,
        }
    }

    /// The same caller sending `Authorization: Bearer <key>`.
    pub fn with_key(&self, key: &str) -> Self {
        Self {
            key: Some(key.to_owned()),
            ..self.clone()
        }
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn auth(&self, rb: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.key {
            Some(k) => rb.bearer_auth(k),
            None => rb,
        }
    }

    async fn finish(rb: reqwest::RequestBuilder) -> Result<(u16, Value), reqwest::Error> {
        let response = rb.send().await?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await?;
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        Ok((status, body))
    }

    /// GET; transport errors returned.
    pub async fn try_get(&self, path: &str) -> Result<(u16, Value), reqwest::Error> {
        Self::finish(self.auth(self.http.get(format!("{}{path}", self.base)))).await
    }

    /// GET.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.try_get(path)
            .await
            .expect("GET failed at the transport level")
    }

    /// GET, returning the raw text (for /metrics).
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let response = self
            .auth(self.http.get(format!("{}{path}", self.base)))
            .send()
            .await
            .expect("GET failed");
        let status = response.status().as_u16();
        (status, response.text().await.expect("body"))
    }

    /// POST a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, serde_json::to_vec(body).unwrap()).await
    }

    /// PATCH a JSON body.
    pub async fn patch(&self, path: &str, body: &Value) -> (u16, Value) {
        let rb = self
            .http
            .patch(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap());
        Self::finish(self.auth(rb))
            .await
            .expect("PATCH failed at the transport level")
    }

    /// PUT a JSON body.
    pub async fn put(&self, path: &str, body: &Value) -> (u16, Value) {
        let rb = self
            .http
            .put(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap());
        Self::finish(self.auth(rb))
            .await
            .expect("PUT failed at the transport level")
    }

    /// DELETE.
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        Self::finish(self.auth(self.http.delete(format!("{}{path}", self.base))))
            .await
            .expect("DELETE failed at the transport level")
    }

    /// The value of one sample of `/metrics`, named with its labels as the
    /// exposition prints them (`runlease_claim_waiters`,
    /// `runlease_jobs_pruned_total{queue="q",state="done"}`); 0 when absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        let (status, text) = self.get_text("/metrics").await;
        assert_eq!(status, 200, "GET /metrics");
        text.lines()
            .find_map(|l| {
                l.strip_prefix(sample)
                    .filter(|rest| rest.starts_with(' '))
                    .and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap_or(0.0)
    }

    /// Polls sample `sample` of `/metrics` (as [`Api::metric`] reads it)
    /// until `pred` holds, 20 s at most; answers the value seen. `what`
    /// names the condition in the failure message.
    pub async fn until_metric(&self, sample: &str, what: &str, pred: impl Fn(f64) -> bool) -> f64 {
        let started = std::time::Instant::now();
        loop {
            let value = self.metric(sample).await;
            if pred(value) {
                return value;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{what}: {sample} is still {value} after 20 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until `n` claims are parked on this coordinator (each has
    /// looked at PostgreSQL once and found nothing, or found its queues
    /// known empty, and waits for a wake-up).
    pub async fn until_claims_parked(&self, n: u32) {
        self.until_metric("runlease_claim_waiters", "claims parked", |v| v >= f64::from(n))
            .await;
    }

    /// Waits until `n` job reads are parked on this coordinator (each has
    /// read its job once, found it not terminal, and waits for a wake-up).
    pub async fn until_reads_parked(&self, n: u32) {
        self.until_metric("runlease_job_waiters", "job reads parked", |v| v >= f64::from(n))
            .await;
    }

    /// POST raw bytes (for malformed bodies).
    pub async fn post_raw(&self, path: &str, body: Vec<u8>) -> (u16, Value) {
        let rb = self
            .http
            .post(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(body);
        Self::finish(self.auth(rb))
            .await
            .expect("POST failed at the transport level")
    }

    /// Enqueues `payload` on `queue` with an attempt budget (201 expected).
    pub async fn enqueue_attempts(&self, queue: &str, payload: Value, max_attempts: i32) -> Job {
        let (status, body) = self
            .post(
                "/v1/jobs",
                &json!({"queue": queue, "payload": payload, "max_attempts": max_attempts}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        serde_json::from_value(body).unwrap()
    }

    /// Enqueues `payload` on `queue` (201 expected).
    pub async fn enqueue(&self, queue: &str, payload: Value) -> Job {
        self.enqueue_with(EnqueueJobRequest::new(QueueName::new(queue).unwrap(), payload))
            .await
    }

    /// Enqueues a full request (201 expected).
    pub async fn enqueue_with(&self, req: EnqueueJobRequest) -> Job {
        let (status, body) = self.post("/v1/jobs", &serde_json::to_value(req).unwrap()).await;
        assert_eq!(status, 201, "enqueue answered {status}: {body}");
        serde_json::from_value(body).unwrap()
    }

    /// Claims up to `max_jobs` from `queue` without waiting.
    pub async fn claim(&self, queue: &str, worker: &str, max_jobs: u32) -> Vec<Lease> {
        self.claim_wait(queue, worker, max_jobs, 0).await
    }

    /// Claims up to `max_jobs` from `queue`, parking up to `wait_ms`.
    pub async fn claim_wait(&self, queue: &str, worker: &str, max_jobs: u32, wait_ms: u64) -> Vec<Lease> {
        let req = ClaimRequest {
            queues: vec![QueueName::new(queue).unwrap()],
            worker_id: WorkerId::new(worker).unwrap(),
            max_jobs,
            wait_ms,
            time_left_ms: None,
        };
        let (status, body) = self.post("/v1/claim", &serde_json::to_value(req).unwrap()).await;
        assert_eq!(status, 200, "claim answered {status}: {body}");
        serde_json::from_value::<runlease_protocol::worker::ClaimResponse>(body)
            .unwrap()
            .leases
    }

    /// Claims exactly one job (panics when none is claimable).
    pub async fn claim_one(&self, queue: &str, worker: &str) -> Lease {
        let mut leases = self.claim(queue, worker, 1).await;
        assert_eq!(leases.len(), 1, "expected one claimable job on {queue}");
        leases.remove(0)
    }

    /// POST /v1/complete.
    pub async fn complete(&self, lease: &Lease, result: Value) -> (u16, Value) {
        self.post(
            "/v1/complete",
            &json!({"lease_token": lease.lease_token, "result": result}),
        )
        .await
    }

    /// POST /v1/fail.
    pub async fn fail(
        &self,
        lease: &Lease,
        error: &str,
        retryable: bool,
        retry_after_ms: Option<i64>,
    ) -> (u16, Value) {
        let mut body = json!({"lease_token": lease.lease_token, "error": error, "retryable": retryable});
        if let Some(ms) = retry_after_ms {
            body["retry_after_ms"] = json!(ms);
        }
        self.post("/v1/fail", &body).await
    }

    /// POST /v1/release.
    pub async fn release(&self, lease: &Lease, progress: Option<Value>) -> (u16, Value) {
        let mut body = json!({"lease_token": lease.lease_token});
        if let Some(p) = progress {
            body["progress"] = p;
        }
        self.post("/v1/release", &body).await
    }

    /// POST /v1/heartbeat for one lease; returns its status text.
    pub async fn heartbeat(&self, lease: &Lease) -> String {
        let (status, body) = self
            .post(
                "/v1/heartbeat",
                &json!({"leases": [{"lease_token": lease.lease_token}]}),
            )
            .await;
        assert_eq!(status, 200, "heartbeat answered {status}: {body}");
        body["leases"][0]["status"].as_str().unwrap().to_owned()
    }

    /// GET /v1/jobs/{id} (200 expected).
    pub async fn job(&self, id: impl std::fmt::Display) -> Job {
        let (status, body) = self.get(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, 200, "get job answered {status}: {body}");
        serde_json::from_value(body).unwrap()
    }
}

/// Polls job `id` until `pred` holds (10 s at most); `what` names the
/// condition in the failure message.
pub async fn until(api: &Api, id: impl std::fmt::Display, what: &str, pred: impl Fn(&Job) -> bool) -> Job {
    for _ in 0..200 {
        let job = api.job(&id).await;
        if pred(&job) {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} never got {what}: {:?}", api.job(&id).await);
}

/// Job `id` once it is terminal (the long-poll of `GET ?wait_ms=`, 20 s).
pub async fn terminal(api: &Api, id: impl std::fmt::Display) -> Job {
    let (status, body) = api.get(&format!("/v1/jobs/{id}?wait_ms=20000")).await;
    assert_eq!(status, 200, "{body}");
    let job: Job = serde_json::from_value(body).unwrap();
    assert!(job.state.is_terminal(), "job {id} is not terminal: {job:?}");
    job
}
