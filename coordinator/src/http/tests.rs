//! Handler rules that need no database, checked without a server: the router
//! is called with `oneshot`, over a store whose pool points at a port where
//! nothing listens (so a request that reaches PostgreSQL shows as 503, and
//! a test that expects an earlier answer proves it never got that far).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use runlease_protocol::{JobId, QueueName, RunLease, WorkerId};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::auth::{ApiKeys, KeyId};
use crate::batch::Parts;
use crate::flow::FlowControl;
use crate::http::{Shared, app};
use crate::limits::LimitSettings;
use crate::metrics::Metrics;
use crate::store::Store;
use crate::store::connect::DatabaseTarget;
use crate::token::TokenKey;
use crate::wake::Wake;

const SECRET: &[u8] = b"a test secret of thirty-two bytes!";
const WORKER: &str = "worker-key-0123456789";
const EMAILS_WORKER: &str = "emails-worker-key-0123456789";
const PRODUCER: &str = "producer-key-0123456789";

/// The app over a database nobody answers for, with `keys` (empty: open
/// mode), batching off, and limits changed by `tweak`.
fn router(keys: &str, tweak: impl FnOnce(&mut LimitSettings)) -> (Router, Arc<Shared>) {
    use clap::Parser;
    let mut config = crate::config::Cli::try_parse_from(["runlease-coordinator"])
        .unwrap()
        .config;
    config.batching.enabled = false;
    config.database.call_timeout = Duration::from_millis(300);
    tweak(&mut config.limits);
    let pool = DatabaseTarget::parse("postgres://postgres@127.0.0.1:1/nowhere")
        .unwrap()
        .pool(1, config.database.deadlines())
        .unwrap();
    let store = Store::new(pool, config.leases.terms(), config.database.call_timeout);
    let metrics = Arc::new(Metrics::new(Duration::from_secs(25)));
    let wake = Wake::local_only();
    let parts = Parts {
        flow: FlowControl::new(store.clone(), wake.clone(), metrics.clone()),
        store,
        wake,
        metrics,
    };
    let keys = ApiKeys::parse(keys).unwrap();
    let state = Shared::new(
        &parts,
        &config,
        TokenKey::new(SECRET),
        keys,
        &TaskTracker::new(),
        CancellationToken::new(),
    );
    let state = Arc::new(state);
    (app(state.clone(), 1024 * 1024), state)
}

fn keyed() -> (Router, Arc<Shared>) {
    router(
        &format!("worker:{WORKER},worker:{EMAILS_WORKER}:emails,producer:{PRODUCER}"),
        |_| {},
    )
}

/// Sends one request; the status and the JSON body.
async fn call(app: &Router, method: &str, path: &str, key: Option<&str>, body: &str) -> (StatusCode, Value) {
    let headers = key.map(|key| ("authorization", format!("Bearer {key}")));
    let (status, _, body) = send(app, method, path, headers.as_slice(), body).await;
    (status, body)
}

/// Sends one request with `headers` (and `Host: 127.0.0.1:8080`); the
/// status, the headers and the JSON body of the answer.
async fn send(
    app: &Router,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &str,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1:8080");
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body.to_owned())).unwrap())
        .await
        .unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (
        status,
        headers,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("(no error body)")
}

#[tokio::test]
async fn keys_and_roles_are_checked_before_anything_else() {
    let (app, _) = keyed();
    let claim = r#"{"queues": ["emails"], "worker_id": "w", "max_jobs": 1, "wait_ms": 0}"#;
    let (status, body) = call(&app, "POST", "/v1/claim", None, claim).await;
    assert_eq!((status, code(&body)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let (status, body) = call(&app, "POST", "/v1/claim", Some("no-such-key-0123456789"), claim).await;
    assert_eq!((status, code(&body)), (StatusCode::UNAUTHORIZED, "unauthorized"));
    let (status, body) = call(&app, "POST", "/v1/claim", Some(PRODUCER), claim).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "forbidden"));
    let other = r#"{"queues": ["billing"], "worker_id": "w", "max_jobs": 1, "wait_ms": 0}"#;
    let (status, body) = call(&app, "POST", "/v1/claim", Some(EMAILS_WORKER), other).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "forbidden"));
}

#[tokio::test]
async fn malformed_and_out_of_range_input_is_refused_with_the_error_body() {
    let (app, _) = keyed();
    let cases = [
        (
            "POST",
            "/v1/claim",
            "{not json",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/claim",
            r#"{"queues": ["q"], "worker_id": "w", "max_jobs": 0, "wait_ms": 0}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim",
            r#"{"queues": ["q"], "worker_id": "w", "max_jobs": 1, "wait_ms": 60001}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim",
            r#"{"queues": ["q"], "worker_id": "w", "max_jobs": 1, "wait_ms": 0, "extra": 1}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            "POST",
            "/v1/heartbeat",
            r#"{"leases": []}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            "POST",
            "/v1/complete",
            r#"{"lease_token": "rl2.nope", "result": 1}"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/finish",
            r#"{"items": [{"lease_token": "x", "action": "fail"}]}"#,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        ("GET", "/v1/nowhere", "", StatusCode::NOT_FOUND, "not_found"),
        (
            "DELETE",
            "/v1/claim",
            "",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "GET",
            "/v1/jobs/not-a-uuid",
            "",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
    ];
    for (method, path, body, status, expected) in cases {
        let (got, answer) = call(&app, method, path, Some(WORKER), body).await;
        assert_eq!(
            (got, code(&answer)),
            (status, expected),
            "{method} {path} {body}: {answer}"
        );
    }
    let huge = format!(
        r#"{{"leases": [{{"lease_token": "{}"}}]}}"#,
        "a".repeat(2 * 1024 * 1024)
    );
    let (status, answer) = call(&app, "POST", "/v1/heartbeat", Some(WORKER), &huge).await;
    assert_eq!(
        (status, code(&answer)),
        (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
    );
}

#[tokio::test]
async fn a_forged_token_is_answered_lease_lost_and_a_foreign_queue_forbidden_without_the_database() {
    let (app, state) = keyed();
    let forged = TokenKey::new(b"another secret of thirty-two bytes").mint(
        JobId::new(),
        RunLease(3),
        &WorkerId::new("w").unwrap(),
        &QueueName::new("emails").unwrap(),
    );
    let body = json!({"items": [{"lease_token": forged, "action": "complete"}]}).to_string();
    let (status, answer) = call(&app, "POST", "/v1/finish", Some(WORKER), &body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["items"][0]["status"], "lease_lost");
    assert_eq!(answer["items"][0]["run_lease"], 3);
    assert_eq!(state.metrics.forged_tokens.get(), 1);
    // A genuine token of an emails job, with a key limited to other queues.
    let reports = router(&format!("worker:{WORKER}:reports"), |_| {}).0;
    let token = TokenKey::new(SECRET).mint(
        JobId::new(),
        RunLease(1),
        &WorkerId::new("w").unwrap(),
        &QueueName::new("emails").unwrap(),
    );
    let body = json!({"lease_token": token, "result": 1}).to_string();
    let (status, answer) = call(&reports, "POST", "/v1/complete", Some(WORKER), &body).await;
    assert_eq!((status, code(&answer)), (StatusCode::FORBIDDEN, "forbidden"));
}

#[tokio::test]
async fn an_unreachable_database_is_503_overloaded_with_retry_after() {
    let (app, _) = keyed();
    let key = [("authorization", format!("Bearer {PRODUCER}"))];
    let (status, headers, body) =
        send(&app, "POST", "/v1/jobs", &key, r#"{"queue": "q", "payload": 1}"#).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(headers["retry-after"], "1");
    assert_eq!(code(&body), "overloaded");
    // The detail stays in the log: the answer names no host or port.
    assert!(!body.to_string().contains("127.0.0.1:1"), "{body}");
}

#[tokio::test]
async fn a_claim_that_would_park_past_its_key_s_limit_is_429_before_the_database() {
    let (app, state) = router(&format!("worker:{WORKER}"), |limits| {
        limits.max_parked_claims_per_key = 1;
    });
    let _held = state.parked_claims.park(KeyId(0)).unwrap();
    let claim = r#"{"queues": ["q"], "worker_id": "w", "max_jobs": 1, "wait_ms": 1000}"#;
    let (status, body) = call(&app, "POST", "/v1/claim", Some(WORKER), claim).await;
    assert_eq!(
        (status, code(&body)),
        (StatusCode::TOO_MANY_REQUESTS, "overloaded")
    );
    // The same claim inside a finish: refused before any item is written.
    let finish =
        json!({"items": [], "claim": {"queues": ["q"], "worker_id": "w", "max_jobs": 1, "wait_ms": 1000}})
            .to_string();
    let (status, _) = call(&app, "POST", "/v1/finish", Some(WORKER), &finish).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn open_mode_refuses_a_foreign_origin_before_the_handler() {
    let (app, _) = router("", |_| {});
    let page = [
        ("origin", "http://evil.example".to_owned()),
        ("content-type", "text/plain".to_owned()),
    ];
    let (status, _, body) = send(&app, "POST", "/v1/jobs", &page, r#"{"queue": "q", "payload": 1}"#).await;
    assert_eq!((status, code(&body)), (StatusCode::FORBIDDEN, "forbidden"));
}
