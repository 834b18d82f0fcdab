//! HTTP endpoints as workers, against real HTTP servers started here (on
//! 127.0.0.1, allowed through `RUNLEASE_ENDPOINT_ALLOW_HOSTS`), each
//! verifying the Standard Webhooks signature of every request it gets: every
//! row of the answers table from a real answer, an enqueue reaching the
//! endpoint by wake-up, key rotation, a late answer for a lost lease
//! refused, `concurrency` across two coordinators, an endpoint down then
//! back without an attempt charged, the SSRF guard at PATCH and at connect
//! time, bad PATCH bodies, and open requests given back when a coordinator
//! stops.
//!
//! The test endpoint answers what the job's payload says: `answers` is a
//! list of `{status, body?, headers?, delay_ms?}`, the n-th request for a
//! job getting the n-th (the last one repeated); no `answers`: 200 `{"ok": true}`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use runlease_protocol::JobState;
use runlease_tests::api::{terminal, until};
use runlease_tests::{Api, TestCoordinator, TestDb};
use serde_json::{Value, json};
use sha2::Sha256;
use tokio::net::TcpListener;

/// One request the test endpoint got.
#[derive(Debug, Clone)]
struct Received {
    headers: HashMap<String, String>,
    body: Vec<u8>,
    json: Value,
}

/// What the test endpoint saw.
#[derive(Clone, Default)]
struct Seen {
    requests: Arc<Mutex<Vec<Received>>>,
    per_job: Arc<Mutex<HashMap<String, usize>>>,
    open: Arc<AtomicUsize>,
    most_open: Arc<AtomicUsize>,
}

impl Seen {
    fn all(&self) -> Vec<Received> {
        self.requests.lock().unwrap().clone()
    }

    fn for_job(&self, id: impl std::fmt::Display) -> Vec<Received> {
        let id = id.to_string();
        self.all()
            .into_iter()
            .filter(|r| r.json["job"]["id"] == id.as_str())
            .collect()
    }

    /// Waits until `pred` holds of what was received (20 s at most).
    async fn until(&self, what: &str, pred: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let started = Instant::now();
        loop {
            let all = self.all();
            if pred(&all) {
                return all;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the endpoint never got {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Leaves the open count when a request ends (answered or abandoned).
struct Opened(Arc<AtomicUsize>);

impl Drop for Opened {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn hook(State(seen): State<Seen>, headers: HeaderMap, body: Bytes) -> Response {
    let now = seen.open.fetch_add(1, Ordering::SeqCst) + 1;
    let _opened = Opened(seen.open.clone());
    seen.most_open.fetch_max(now, Ordering::SeqCst);
    let json: Value = serde_json::from_slice(&body).expect("the request body is JSON");
    let job_id = json["job"]["id"].as_str().unwrap_or_default().to_owned();
    let n = {
        let mut per_job = seen.per_job.lock().unwrap();
        let n = per_job.entry(job_id).or_default();
        *n += 1;
        *n - 1
    };
    let headers: HashMap<String, String> = headers
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or_default().to_owned()))
        .collect();
    seen.requests.lock().unwrap().push(Received {
        headers,
        body: body.to_vec(),
        json: json.clone(),
    });
    let answers = json["job"]["payload"]["answers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let answer = answers
        .get(n.min(answers.len().saturating_sub(1)))
        .cloned()
        .unwrap_or(json!({"status": 200, "body": {"ok": true}}));
    if let Some(ms) = answer["delay_ms"].as_u64() {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    let status = StatusCode::from_u16(answer["status"].as_u64().unwrap_or(200) as u16).unwrap();
    let body = match &answer["body"] {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut response = (status, body).into_response();
    if let Some(extra) = answer["headers"].as_object() {
        for (k, v) in extra {
            response.headers_mut().insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.as_str().unwrap().parse().unwrap(),
            );
        }
    }
    response
}

/// A test endpoint serving on `listener` until dropped.
struct TestEndpoint {
    addr: SocketAddr,
    seen: Seen,
    task: tokio::task::JoinHandle<()>,
}

impl TestEndpoint {
    async fn start() -> Self {
        Self::serve(TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    fn serve(listener: TcpListener) -> Self {
        let addr = listener.local_addr().unwrap();
        let seen = Seen::default();
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(seen.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, seen, task }
    }

    fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }
}

impl Drop for TestEndpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The signatures of `webhook-signature` that `secret` verifies, as a
/// Standard Webhooks receiver checks them.
fn verifies(secret: &str, r: &Received) -> bool {
    let key = STANDARD
        .decode(secret.strip_prefix("whsec_").expect("a whsec_ secret"))
        .unwrap();
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key).unwrap();
    let (id, ts) = (&r.headers["webhook-id"], &r.headers["webhook-timestamp"]);
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(&r.body);
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    r.headers["webhook-signature"].split(' ').any(|s| s == expected)
}

async fn set_endpoint(api: &Api, queue: &str, endpoint: Value) -> Value {
    let (status, body) = api
        .patch(&format!("/v1/queues/{queue}"), &json!({"endpoint": endpoint}))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn secret(api: &Api, queue: &str) -> Value {
    let (status, body) = api.get(&format!("/v1/queues/{queue}/endpoint-secret")).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn enqueue(api: &Api, queue: &str, payload: Value, max_attempts: i32) -> runlease_protocol::Job {
    api.enqueue_attempts(queue, payload, max_attempts).await
}

fn allow_loopback(cfg: &mut runlease_coordinator::config::Config) {
    cfg.endpoints.allow_hosts = Some("127.0.0.1".into());
}

/// Attempts of a job that charged its budget (released ones gave it back).
async fn attempts_charged(db: &TestDb, id: impl std::fmt::Display) -> i64 {
    let id = uuid::Uuid::parse_str(&id.to_string()).unwrap();
    db.scalar("SELECT attempt::bigint FROM jobs WHERE id = $1", &[&id])
        .await
}

#[tokio::test]
async fn every_row_of_the_answers_table_from_a_real_answer() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, allow_loopback).await;
    let ep = TestEndpoint::start().await;
    let figures = set_endpoint(&c.api, "edge", json!({"url": ep.url(), "timeout_ms": 1000})).await;
    assert_eq!(figures["endpoint"]["concurrency"], 10);
    assert_eq!(figures["endpoint"]["healthy"], true);
    let key = secret(&c.api, "edge").await["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    let ok = |status: u16, body: Value| json!({"answers": [{"status": status, "body": body}]});
    let json_done = enqueue(&c.api, "edge", ok(200, json!({"sum": 3})), 3).await;
    let empty_done = enqueue(&c.api, "edge", ok(204, Value::Null), 3).await;
    let text_done = enqueue(&c.api, "edge", ok(201, json!("plain words")), 3).await;
    let no_retry = enqueue(
        &c.api,
        "edge",
        json!({"answers": [{"status": 422, "body": "bad payload", "headers": {"runlease-no-retry": "true"}}]}),
        3,
    )
    .await;
    let retried = enqueue(
        &c.api,
        "edge",
        json!({"answers": [{"status": 500, "body": "boom"}, {"status": 200, "body": {"second": true}}]}),
        3,
    )
    .await;
    let timed_out = enqueue(
        &c.api,
        "edge",
        json!({"answers": [{"status": 200, "delay_ms": 3000}]}),
        1,
    )
    .await;

    assert_eq!(
        terminal(&c.api, json_done.id).await.result,
        Some(json!({"sum": 3}))
    );
    let empty = terminal(&c.api, empty_done.id).await;
    assert_eq!(empty.state, JobState::Done);
    // A null result reads back as no result.
    assert_eq!(empty.result.unwrap_or(Value::Null), Value::Null);
    assert_eq!(
        terminal(&c.api, text_done.id).await.result,
        Some(json!("plain words"))
    );
    let failed = terminal(&c.api, no_retry.id).await;
    assert_eq!((failed.state, failed.attempt), (JobState::Failed, 1));
    assert_eq!(
        failed.error.as_deref(),
        Some("endpoint answered 422: bad payload")
    );
    let second = terminal(&c.api, retried.id).await;
    assert_eq!((second.state, second.attempt), (JobState::Done, 2));
    assert_eq!(second.result, Some(json!({"second": true})));
    let (_, chronology) = c.api.get(&format!("/v1/jobs/{}", retried.id)).await;
    assert_eq!(
        chronology["attempts"][0]["error"], "endpoint answered 500: boom",
        "{chronology}"
    );
    let late = terminal(&c.api, timed_out.id).await;
    assert_eq!(late.state, JobState::Failed);
    assert_eq!(late.error.as_deref(), Some("endpoint timed out after 1000 ms"));

    // Every request was signed with the queue's secret and says who sent it.
    for r in ep.seen.all() {
        assert!(verifies(&key, &r), "signature of {:?}", r.headers);
        let lease = &r.json["lease"];
        let id = format!("{}:{}", r.json["job"]["id"].as_str().unwrap(), lease["run_lease"]);
        assert_eq!(r.headers["webhook-id"], id);
        assert!(r.headers["user-agent"].starts_with("runlease/"));
        assert_eq!(r.headers["content-type"], "application/json");
        assert_eq!(r.headers["traceparent"].len(), 55);
        assert_eq!(r.json["coordinator_url"], format!("http://{}", c.addr));
        assert!(lease["lease_token"].as_str().is_some_and(|t| !t.is_empty()));
        assert_eq!(r.json["job"]["max_attempts"].as_i64().map(|n| n >= 1), Some(true));
    }
    let counted = c
        .api
        .metric("runlease_endpoint_requests_total{queue=\"edge\",outcome=\"completed\"}")
        .await;
    assert_eq!(counted, 4.0);
    assert_eq!(
        c.api
            .metric("runlease_endpoint_requests_total{queue=\"edge\",outcome=\"timed_out\"}")
            .await,
        1.0
    );
    let (_, figures) = c.api.get("/v1/queues/edge").await;
    assert_eq!(
        figures["endpoint"]["last_error"], "endpoint timed out after 1000 ms",
        "{figures}"
    );
}

#[tokio::test]
async fn busy_answers_release_without_charge_and_a_202_hands_the_lease_over() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, allow_loopback).await;
    let ep = TestEndpoint::start().await;
    set_endpoint(&c.api, "edge", json!({"url": ep.url()})).await;
    let busy = json!({"answers": [
        {"status": 429, "headers": {"retry-after": "1"}},
        {"status": 503},
        {"status": 200, "body": {"at_last": true}}
    ]});
    let job = enqueue(&c.api, "edge", busy, 1).await;
    let done = terminal(&c.api, job.id).await;
    assert_eq!(
        (done.state, done.result),
        (JobState::Done, Some(json!({"at_last": true})))
    );
    // Three requests, one attempt charged: the busy answers gave theirs back.
    let requests = ep.seen.for_job(job.id);
    assert_eq!(requests.len(), 3);
    assert_eq!(attempts_charged(&db, job.id).await, 1);
    // Retry-After: 1 held the job (and the endpoint) back a second.
    let at = |r: &Received| r.headers["webhook-timestamp"].parse::<i64>().unwrap();
    assert!(
        at(&requests[1]) - at(&requests[0]) >= 1,
        "Retry-After was not honoured"
    );
    assert_eq!(
        c.api
            .metric("runlease_endpoint_requests_total{queue=\"edge\",outcome=\"busy\"}")
            .await,
        2.0
    );

    // 202: the function holds the lease and finishes it itself.
    let handed = enqueue(&c.api, "edge", json!({"answers": [{"status": 202}]}), 3).await;
    let got = ep
        .seen
        .until("the hand-off request", |all| {
            all.iter()
                .any(|r| r.json["job"]["id"] == handed.id.to_string().as_str())
        })
        .await;
    let request = got
        .iter()
        .find(|r| r.json["job"]["id"] == handed.id.to_string().as_str())
        .unwrap();
    until(&c.api, handed.id, "running, handed off", |j| {
        j.state == JobState::Running
    })
    .await;
    c.api
        .until_metric(
            "runlease_endpoint_requests_total{queue=\"edge\",outcome=\"handed_off\"}",
            "the hand-off counted",
            |n| n == 1.0,
        )
        .await;
    let token = request.json["lease"]["lease_token"].clone();
    let (status, body) = c
        .api
        .post("/v1/heartbeat", &json!({"leases": [{"lease_token": token}]}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = c
        .api
        .post("/v1/complete", &json!({"lease_token": token, "result": "later"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(terminal(&c.api, handed.id).await.result, Some(json!("later")));
}

#[tokio::test]
async fn an_enqueue_reaches_a_parked_dispatcher_by_wake_up() {
    let db = TestDb::new().await;
    // Re-checks a minute apart: only a wake-up can bring the job in time.
    let c = TestCoordinator::start_with(&db, |cfg| {
        allow_loopback(cfg);
        cfg.leases.claim_recheck = Duration::from_secs(60);
    })
    .await;
    let ep = TestEndpoint::start().await;
    set_endpoint(&c.api, "edge", json!({"url": ep.url()})).await;
    c.api.until_claims_parked(1).await;
    for n in 0..5 {
        let started = Instant::now();
        let job = enqueue(&c.api, "edge", json!(n), 3).await;
        ep.seen
            .until("the job", |all| {
                all.iter()
                    .any(|r| r.json["job"]["id"] == job.id.to_string().as_str())
            })
            .await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_millis(500),
            "enqueue → request took {took:?}"
        );
        terminal(&c.api, job.id).await;
        c.api.until_claims_parked(1).await;
    }
}

#[tokio::test]
async fn both_secrets_sign_during_a_rotation_window_and_only_the_new_one_after() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        allow_loopback(cfg);
        cfg.endpoints.rotation = Duration::from_secs(3);
    })
    .await;
    let ep = TestEndpoint::start().await;
    set_endpoint(&c.api, "edge", json!({"url": ep.url()})).await;
    let old = secret(&c.api, "edge").await["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(old.starts_with("whsec_") && STANDARD.decode(&old[6..]).unwrap().len() == 32);
    let (status, rotated) = c
        .api
        .post("/v1/queues/edge/endpoint-secret/rotate", &json!({}))
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new, old);
    assert_eq!(rotated["previous_secret"], old.as_str());
    assert_eq!(secret(&c.api, "edge").await, rotated);

    let during = enqueue(&c.api, "edge", json!("during"), 3).await;
    terminal(&c.api, during.id).await;
    let r = &ep.seen.for_job(during.id)[0];
    assert!(verifies(&old, r) && verifies(&new, r), "{:?}", r.headers);
    assert_eq!(r.headers["webhook-signature"].split(' ').count(), 2);

    // After the window only the new secret signs.
    let started = Instant::now();
    while secret(&c.api, "edge").await["previous_secret"] != Value::Null {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the rotation window never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The view of the settings is refreshed every second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let after = enqueue(&c.api, "edge", json!("after"), 3).await;
    terminal(&c.api, after.id).await;
    let r = &ep.seen.for_job(after.id)[0];
    assert!(verifies(&new, r) && !verifies(&old, r), "{:?}", r.headers);
    // A queue that never had an endpoint has no secret.
    let (status, body) = c
        .api
        .post("/v1/queues/other/endpoint-secret/rotate", &json!({}))
        .await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
}

#[tokio::test]
async fn a_late_answer_for_a_lost_lease_changes_nothing_and_the_newer_lease_completes() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        allow_loopback(cfg);
        cfg.leases.reaper_interval = Duration::from_millis(100);
    })
    .await;
    let ep = TestEndpoint::start().await;
    set_endpoint(&c.api, "edge", json!({"url": ep.url(), "timeout_ms": 10000})).await;
    let job = enqueue(
        &c.api,
        "edge",
        json!({"answers": [
            {"status": 200, "delay_ms": 2500, "body": {"stale": true}},
            {"status": 200, "body": {"fresh": true}}
        ]}),
        3,
    )
    .await;
    let id = job.id.to_string();
    ep.seen
        .until("the first request", |all| {
            all.iter().any(|r| r.json["job"]["id"] == id.as_str())
        })
        .await;
    // The coordinator stalled past the TTL: its lease expires and is reaped.
    let uuid = uuid::Uuid::parse_str(&id).unwrap();
    db.client()
        .await
        .execute(
            "UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
            &[&uuid],
        )
        .await
        .unwrap();
    let done = terminal(&c.api, job.id).await;
    assert_eq!((done.state, done.run_lease.0), (JobState::Done, 2));
    assert_eq!(done.result, Some(json!({"fresh": true})));
    // The first request's answer comes later and is refused by the guard.
    c.api
        .until_metric(
            "runlease_endpoint_requests_total{queue=\"edge\",outcome=\"lease_lost\"}",
            "the late answer refused",
            |n| n == 1.0,
        )
        .await;
    let after = c.api.job(job.id).await;
    assert_eq!(after, done, "the late answer changed the job");
    let (_, full) = c.api.get(&format!("/v1/jobs/{}", job.id)).await;
    let outcomes: Vec<&str> = full["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(outcomes, ["lease_expired", "completed"], "{full}");
}

#[tokio::test]
async fn a_cancel_aborts_the_open_request() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        allow_loopback(cfg);
        cfg.leases.heartbeat_interval = Duration::from_millis(200);
    })
    .await;
    let ep = TestEndpoint::start().await;
    set_endpoint(&c.api, "edge", json!({"url": ep.url(), "timeout_ms": 60000})).await;
    let job = enqueue(
        &c.api,
        "edge",
        json!({"answers": [{"status": 200, "delay_ms": 30000}]}),
        3,
    )
    .await;
    let id = job.id.to_string();
    ep.seen
        .until("the request", |all| {
            all.iter().any(|r| r.json["job"]["id"] == id.as_str())
        })
        .await;
    let started = Instant::now();
    let (status, body) = c.api.post(&format!("/v1/jobs/{id}/cancel"), &json!({})).await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let cancelled = terminal(&c.api, job.id).await;
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(started.elapsed() < Duration::from_secs(5));
    // The endpoint saw its request dropped.
    let open = Instant::now();
    while ep.seen.open.load(Ordering::SeqCst) > 0 {
        assert!(
            open.elapsed() < Duration::from_secs(5),
            "the request was not aborted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        c.api
            .metric("runlease_endpoint_requests_total{queue=\"edge\",outcome=\"cancelled\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn concurrency_holds_across_two_coordinators() {
    let db = TestDb::new().await;
    let a = TestCoordinator::start_with(&db, allow_loopback).await;
    let b = TestCoordinator::start_with(&db, allow_loopback).await;
    let ep = TestEndpoint::start().await;
    set_endpoint(&a.api, "edge", json!({"url": ep.url(), "concurrency": 5})).await;
    // Both dispatchers waiting (b learns of the endpoint at its next view refresh).
    a.api.until_claims_parked(1).await;
    b.api.until_claims_parked(1).await;
    let slow = json!({"answers": [{"status": 200, "delay_ms": 60}]});
    let batch: Vec<Value> = (0..60)
        .map(|_| json!({"queue": "edge", "payload": slow}))
        .collect();
    let (status, body) = b.api.post("/v1/jobs/batch", &json!({"jobs": batch})).await;
    assert_eq!(status, 201, "{body}");
    let started = Instant::now();
    loop {
        let (_, q) = a.api.get("/v1/queues/edge").await;
        if q["counts"]["done"] == 60 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "not drained: {q}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let most = ep.seen.most_open.load(Ordering::SeqCst);
    assert!((2..=5).contains(&most), "{most} requests were open at once");
    // Both coordinators sent some.
    let sent = |api: Api| async move {
        api.metric("runlease_endpoint_requests_total{queue=\"edge\",outcome=\"completed\"}")
            .await
    };
    let (from_a, from_b) = (sent(a.api.clone()).await, sent(b.api.clone()).await);
    assert_eq!(from_a + from_b, 60.0);
    assert!(from_a > 0.0 && from_b > 0.0, "a sent {from_a}, b {from_b}");
}

#[tokio::test]
async fn an_endpoint_down_then_back_burns_no_attempt_and_shows_unhealthy_then_healthy() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        allow_loopback(cfg);
        cfg.endpoints.backoff = Duration::from_millis(200);
        cfg.endpoints.backoff_max = Duration::from_secs(4);
    })
    .await;
    // A port nothing listens on: connections are refused, for 30 s.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/hook");
    set_endpoint(&c.api, "edge", json!({"url": url})).await;
    let down_since = Instant::now();
    let mut jobs = Vec::new();
    for n in 0..10 {
        // One attempt each: a charged attempt would fail the job.
        jobs.push(enqueue(&c.api, "edge", json!(n), 1).await);
    }
    let healthy = "runlease_endpoint_healthy{queue=\"edge\"}";
    c.api.until_metric(healthy, "unhealthy", |v| v == 0.0).await;
    let started = Instant::now();
    loop {
        let (_, q) = c.api.get("/v1/queues/edge").await;
        if q["endpoint"]["healthy"] == false {
            assert!(
                q["endpoint"]["last_error"]
                    .as_str()
                    .is_some_and(|e| !e.is_empty()),
                "{q}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the figures never showed it unhealthy: {q}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Down for 30 s in all (backing off, up to 4 s between tries), then
    // back on the same port.
    tokio::time::sleep_until((down_since + Duration::from_secs(30)).into()).await;
    let ep = TestEndpoint::serve(TcpListener::bind(("127.0.0.1", port)).await.unwrap());
    for job in &jobs {
        let done = terminal(&c.api, job.id).await;
        assert_eq!(done.state, JobState::Done, "{done:?}");
        assert_eq!(attempts_charged(&db, job.id).await, 1);
    }
    c.api.until_metric(healthy, "healthy again", |v| v == 1.0).await;
    let (_, q) = c.api.get("/v1/queues/edge").await;
    assert_eq!(q["endpoint"]["healthy"], true, "{q}");
    assert_eq!(q["counts"]["failed"], 0);
    assert!(
        c.api
            .metric("runlease_endpoint_requests_total{queue=\"edge\",outcome=\"no_connection\"}")
            .await
            >= 5.0
    );
    assert_eq!(ep.seen.all().len(), 10);
}

#[tokio::test]
async fn internal_addresses_are_refused_when_set_and_when_connecting() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, allow_loopback).await;
    for url in [
        "https://10.0.0.8/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "http://example.com/hook",
        "https://0.0.0.0/",
    ] {
        let (status, body) = c
            .api
            .patch("/v1/queues/edge", &json!({"endpoint": {"url": url}}))
            .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (422, Some("invalid")),
            "{url}: {body}"
        );
    }
    // A name not listed that resolves to loopback passes the PATCH (https,
    // a name) and is refused at connect time: no connection is made.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let acceptor = tokio::spawn(async move {
        while listener.accept().await.is_ok() {
            counter.fetch_add(1, Ordering::SeqCst);
        }
    });
    set_endpoint(
        &c.api,
        "edge",
        json!({"url": format!("https://localhost:{port}/hook")}),
    )
    .await;
    let job = enqueue(&c.api, "edge", json!("inside"), 1).await;
    let started = Instant::now();
    let error = loop {
        let (_, q) = c.api.get("/v1/queues/edge").await;
        if let Some(e) = q["endpoint"]["last_error"].as_str() {
            break e.to_owned();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no refusal recorded: {q}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        error.contains("loopback") && error.contains("RUNLEASE_ENDPOINT_ALLOW_HOSTS"),
        "{error}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 0);
    // Released each time, uncharged: queued with no attempt used, or in its
    // next (refused) request.
    let id = uuid::Uuid::parse_str(&job.id.to_string()).unwrap();
    let uncharged = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE id = $1
               AND ((state = 'queued' AND attempt = 0) OR (state = 'running' AND attempt = 1))",
            &[&id],
        )
        .await;
    assert_eq!(uncharged, 1, "{:?}", c.api.job(job.id).await);
    acceptor.abort();
}

#[tokio::test]
async fn bad_endpoint_settings_get_the_json_error_and_change_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, allow_loopback).await;
    let cases = [
        json!({"endpoint": {}}),
        json!({"endpoint": "https://example.com"}),
        json!({"endpoint": {"url": "https://example.com", "colour": "red"}}),
        json!({"endpoint": {"url": "https://example.com", "timeout_ms": 999}}),
        json!({"endpoint": {"url": "https://example.com", "timeout_ms": 900001}}),
        json!({"endpoint": {"url": "https://example.com", "concurrency": 0}}),
        json!({"endpoint": {"url": "https://example.com", "concurrency": 1001}}),
        json!({"endpoint": {"url": "https://example.com", "concurrency": "many"}}),
        json!({"endpoint": {"url": "ftp://example.com/"}}),
        json!({"endpoint": {"url": "not a url"}}),
        json!({"endpoint": {"url": format!("https://example.com/{}", "a".repeat(3000))}}),
    ];
    for body in cases {
        let (status, answer) = c.api.patch("/v1/queues/edge", &body).await;
        assert!(status == 400 || status == 422, "{body} → {status} {answer}");
        assert!(
            answer["error"]["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
    }
    let (_, q) = c.api.get("/v1/queues/edge").await;
    assert!(q.get("endpoint").is_none(), "{q}");
    let (status, body) = c.api.get("/v1/queues/edge/endpoint-secret").await;
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("not_found")));
    // Removing it again: null.
    set_endpoint(&c.api, "edge", json!({"url": "https://example.com/hook"})).await;
    let q = set_endpoint(&c.api, "edge", Value::Null).await;
    assert!(q.get("endpoint").is_none(), "{q}");
    // The secret outlives the endpoint.
    secret(&c.api, "edge").await;
}

#[tokio::test]
async fn a_coordinator_that_stops_gives_its_open_requests_back_uncharged() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, allow_loopback).await;
    let ep = TestEndpoint::start().await;
    set_endpoint(&c.api, "edge", json!({"url": ep.url(), "timeout_ms": 60000})).await;
    let job = enqueue(
        &c.api,
        "edge",
        json!({"answers": [{"status": 200, "delay_ms": 30000}, {"status": 200, "body": {"again": true}}]}),
        1,
    )
    .await;
    let id = job.id.to_string();
    ep.seen
        .until("the request", |all| {
            all.iter().any(|r| r.json["job"]["id"] == id.as_str())
        })
        .await;
    let started = Instant::now();
    c.stop().await.expect("a clean stop");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "stopping took {:?}",
        started.elapsed()
    );
    let uuid = uuid::Uuid::parse_str(&id).unwrap();
    let back = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE id = $1 AND state = 'queued' AND attempt = 0",
            &[&uuid],
        )
        .await;
    assert_eq!(back, 1, "the open request's lease was not given back uncharged");
    // Another coordinator sends it again; its one attempt is still there.
    let again = TestCoordinator::start_with(&db, allow_loopback).await;
    let done = terminal(&again.api, job.id).await;
    assert_eq!((done.state, done.attempt), (JobState::Done, 1));
    assert_eq!(done.result, Some(json!({"again": true})));
}
