//! `GET /openapi.yaml` serves the repository's OpenAPI description, without
//! a key, and it names every route of the protocol (and no other).

use runlease_protocol::{ErrorCode, routes};
use runlease_tests::{TestCoordinator, TestDb};

/// Every path the coordinator routes, as `protocol/src/routes.rs` names them.
const ROUTES: [&str; 16] = [
    routes::JOBS,
    routes::JOBS_BATCH,
    routes::JOB,
    routes::JOB_CANCEL,
    routes::JOB_RETRY,
    routes::CLAIM,
    routes::HEARTBEAT,
    routes::COMPLETE,
    routes::FAIL,
    routes::RELEASE,
    routes::FINISH,
    routes::QUEUES,
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
        cfg.api_keys = Some("admin:admin-key-0123456789".into());
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
