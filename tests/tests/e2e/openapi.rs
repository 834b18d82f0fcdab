//! `GET /openapi.yaml` serves the repository's OpenAPI description, without
//! a key, and it names every route of the protocol (and no other).

use runlease_protocol::{ErrorCode, routes};
use runlease_tests::{TestCoordinator, TestDb};

/// Every path the coordinator routes, as `protocol/src/routes.rs` names them.
const ROUTES: [&str; 24] = [
    routes::JOBS,
    routes::JOBS_BATCH,
    routes::JOBS_BULK,
    routes::JOB,
    routes::JOB_ATTEMPTS,
    routes::JOB_CANCEL,
    routes::JOB_RETRY,
    routes::CLAIM,
    routes::HEARTBEAT,
    routes::COMPLETE,
    routes::FAIL,
    routes::RELEASE,
    routes::FINISH,
    routes::QUEUES,
    routes::QUEUE,
    routes::QUEUE_ENDPOINT_SECRET,
    routes::QUEUE_ENDPOINT_SECRET_ROTATE,
    routes::SCHEDULES,
    routes::SCHEDULE,
    routes::WHOAMI,
    routes::HEALTHZ,
    routes::READYZ,
    routes::METRICS,
    routes::OPENAPI,
];

/// The repository's file, which the coordinator builds in.
const SPEC: &str = include_str!("../../../docs/openapi.yaml");

/// The path keys of the `paths:` section: lines of the form `  /...:`.
fn documented_paths(spec: &str) -> Vec<&str> {
    spec.lines()
        .filter(|line| line.starts_with("  /"))
        .filter_map(|line| line[2..].strip_suffix(':'))
        .collect()
}

#[tokio::test]
async fn openapi_yaml_is_served_without_a_key_and_names_every_route() {
    let db = TestDb::new().await;
    // Keys configured: the document must still need none, like /healthz.
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.api_keys = Some("admin:admin-key-0123456789".into());
    })
    .await;
    let response = reqwest::get(format!("{}{}", c.api.base(), routes::OPENAPI))
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/yaml")
    );
    let text = response.text().await.unwrap();
    assert!(text.starts_with("openapi:"), "{}", &text[..text.len().min(200)]);
    assert_eq!(text, SPEC, "the served document is docs/openapi.yaml");

    let mut documented = documented_paths(&text);
    let mut routed = ROUTES.to_vec();
    documented.sort_unstable();
    routed.sort_unstable();
    assert_eq!(documented, routed, "paths in docs/openapi.yaml versus routes.rs");
    for route in ROUTES {
        assert!(
            text.contains(&format!("\n  {route}:\n")),
            "{route} is not documented"
        );
    }

    // Every error code of the protocol is in the document.
    for code in [
        ErrorCode::BadRequest,
        ErrorCode::Invalid,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::LeaseLost,
        ErrorCode::Conflict,
        ErrorCode::TooLarge,
        ErrorCode::Overloaded,
        ErrorCode::Internal,
    ] {
        let code = code.as_str();
        assert!(
            text.contains(&format!("const: {code}")),
            "{code} has no error schema"
        );
    }
    c.stop().await.unwrap();
}

#[test]
fn openapi_yaml_states_the_limits_of_limits_rs() {
    use runlease_protocol::limits::{
        DEFAULT_ENDPOINT_CONCURRENCY, DEFAULT_ENDPOINT_TIMEOUT_MS, MAX_ENDPOINT_CONCURRENCY,
        MAX_ENDPOINT_TIMEOUT_MS, MAX_ENDPOINT_URL_LEN, MIN_ENDPOINT_TIMEOUT_MS,
    };
    use runlease_protocol::limits::{
        MAX_ATTEMPTS_LIMIT, MAX_BATCH_JOBS, MAX_BULK_IDS, MAX_CLAIM_JOBS, MAX_CLAIM_QUEUES,
        MAX_CONCURRENCY_KEY_LEN, MAX_DELAY_MS, MAX_ERROR_LEN, MAX_IDEMPOTENCY_KEY_LEN,
        MAX_LEASES_PER_REQUEST, MAX_LIST_LIMIT, MAX_QUEUE_NAME_LEN, MAX_RATE, MAX_RETENTION_MS,
        MAX_RUNNING_LIMIT, MAX_SCHEDULE_NAME_LEN, MAX_TIMEOUT_MS, MAX_WAIT_MS, MAX_WORKER_ID_LEN,
    };
    use runlease_protocol::limits::{MAX_BACKOFF_FACTOR, MAX_BACKOFF_MS, MAX_RETRY_WINDOW_MS};
    use runlease_protocol::limits::{MAX_DEPENDENCIES, MAX_DEPENDENTS_SHOWN, MAX_REF_LEN};
    let expected = [
        format!("maxLength: {MAX_QUEUE_NAME_LEN}"),
        format!("maxLength: {MAX_WORKER_ID_LEN}"),
        format!("maxLength: {MAX_IDEMPOTENCY_KEY_LEN}"),
        format!("maxItems: {MAX_BATCH_JOBS}"),
        format!("maxItems: {MAX_CLAIM_QUEUES}"),
        format!("maximum: {MAX_CLAIM_JOBS}"),
        format!("maximum: {MAX_WAIT_MS}"),
        format!("maxItems: {MAX_LEASES_PER_REQUEST}"),
        format!("maximum: {MAX_ATTEMPTS_LIMIT}"),
        format!("maximum: {MAX_TIMEOUT_MS}"),
        format!("maximum: {MAX_DELAY_MS}"),
        format!("cut to {MAX_ERROR_LEN} bytes"),
        format!("maxLength: {MAX_CONCURRENCY_KEY_LEN}"),
        format!("maxLength: {MAX_SCHEDULE_NAME_LEN}"),
        format!("maximum: {MAX_LIST_LIMIT}"),
        format!("maxItems: {MAX_BULK_IDS}"),
        format!("maximum: {MAX_RUNNING_LIMIT}"),
        format!("maximum: {MAX_RATE}"),
        format!("maximum: {MAX_RETENTION_MS}"),
        format!("maxLength: {MAX_ENDPOINT_URL_LEN}"),
        format!("minimum: {MIN_ENDPOINT_TIMEOUT_MS}"),
        format!("maximum: {MAX_ENDPOINT_TIMEOUT_MS}"),
        format!("maximum: {MAX_ENDPOINT_CONCURRENCY}"),
        format!("default {DEFAULT_ENDPOINT_TIMEOUT_MS}"),
        format!("default {DEFAULT_ENDPOINT_CONCURRENCY}"),
        format!("maxItems: {MAX_DEPENDENCIES}"),
        format!("maxLength: {MAX_REF_LEN}"),
        format!("The first {MAX_DEPENDENTS_SHOWN} jobs that depend on it"),
        format!("maximum: {MAX_BACKOFF_MS}"),
        format!("maximum: {MAX_RETRY_WINDOW_MS}"),
        format!("maximum: {MAX_BACKOFF_FACTOR}"),
    ];
    for limit in expected {
        assert!(SPEC.contains(&limit), "docs/openapi.yaml does not say {limit:?}");
    }
}
