//! Bad input gets a 4xx with the JSON error body, writes nothing, and leaves
//! the coordinator (and its pool) healthy.

use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

fn is_error_body(body: &Value, code: &str) -> bool {
    body["error"]["code"] == code && body["error"]["message"].as_str().is_some_and(|m| !m.is_empty())
}

#[tokio::test]
async fn every_bad_input_gets_its_4xx_and_writes_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| cfg.server.max_body_bytes = 64 * 1024).await;
    let running = c.api.enqueue("q", json!("keep me")).await;
    let lease = c.api.claim_one("q", "w").await;
    let snapshot = c.api.job(running.id).await;
    let token = lease.lease_token.0.clone();
    let unknown = uuid::Uuid::now_v7();

    // (method, path, body, expected status, expected code)
    type Case = (&'static str, String, Option<Vec<u8>>, u16, &'static str);
    let cases: Vec<Case> = vec![
        // Not JSON at all, or cut short.
        (
            "POST",
            "/v1/jobs".into(),
            Some(b"{not json".to_vec()),
            400,
            "bad_request",
        ),
        ("POST", "/v1/jobs".into(), Some(b"".to_vec()), 400, "bad_request"),
        (
            "POST",
            "/v1/jobs".into(),
            Some(b"{\"queue\":\"q\",\"payload\":1} trailing".to_vec()),
            400,
            "bad_request",
        ),
        (
            "POST",
            "/v1/claim".into(),
            Some(vec![0xff, 0xfe, 0x00]),
            400,
            "bad_request",
        ),
        // Missing, mistyped, unknown fields.
        (
            "POST",
            "/v1/jobs".into(),
            Some(json!({"payload": 1}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(json!({"queue": "q"}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(json!({"queue": 5, "payload": 1}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "priorty": 1})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(json!([1, 2]).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(json!({"queue": "has space", "payload": 1}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(json!({"queue": "", "payload": 1}).to_string().into()),
            422,
            "invalid",
        ),
        // Out of range numbers.
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "max_attempts": 0})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "max_attempts": 100000})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "priority": 1e40})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "priority": 3000000000u64})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "delay_ms": -1})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "timeout_ms": 0})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "delay_ms": 5, "run_at": "2030-01-01T00:00:00Z"})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "run_at": "tomorrow"})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": 1, "idempotency_key": ""})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": "nul \u{0000} inside"})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/batch".into(),
            Some(json!({"jobs": []}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim".into(),
            Some(
                json!({"queues": ["q"], "worker_id": "w", "max_jobs": 0})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim".into(),
            Some(
                json!({"queues": ["q"], "worker_id": "w", "max_jobs": 1001})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim".into(),
            Some(
                json!({"queues": ["q"], "worker_id": "w", "wait_ms": 60001})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim".into(),
            Some(
                json!({"queues": ["q"], "worker_id": "w", "wait_ms": -5})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim".into(),
            Some(json!({"queues": [], "worker_id": "w"}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/claim".into(),
            Some(json!({"queues": ["q"], "worker_id": ""}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/heartbeat".into(),
            Some(json!({"leases": []}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/fail".into(),
            Some(
                json!({"lease_token": token, "error": "x", "retry_after_ms": -1})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/fail".into(),
            Some(json!({"lease_token": token}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/complete".into(),
            Some(json!({"lease_token": 42}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/complete".into(),
            Some(
                json!({"lease_token": token, "result": "nul \u{0000}"})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/finish".into(),
            Some(
                json!({"items": [{"lease_token": token, "action": "explode"}]})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        ("GET", "/v1/jobs/not-a-uuid".into(), None, 400, "bad_request"),
        ("GET", format!("/v1/jobs/{unknown}"), None, 404, "not_found"),
        (
            "GET",
            format!("/v1/jobs/{}?wait_ms=abc", running.id),
            None,
            400,
            "bad_request",
        ),
        (
            "GET",
            format!("/v1/jobs/{}?wait_ms=60001", running.id),
            None,
            422,
            "invalid",
        ),
        (
            "POST",
            format!("/v1/jobs/{unknown}/cancel"),
            Some(b"{}".to_vec()),
            404,
            "not_found",
        ),
        (
            "POST",
            format!("/v1/jobs/{unknown}/retry"),
            Some(b"{}".to_vec()),
            404,
            "not_found",
        ),
        (
            "POST",
            "/v1/jobs/zzz/cancel".into(),
            Some(b"{}".to_vec()),
            400,
            "bad_request",
        ),
        // Listing: queue required, known states, limits in range, cursors
        // only as issued.
        ("GET", "/v1/jobs".into(), None, 422, "invalid"),
        ("GET", "/v1/jobs?queue=".into(), None, 422, "invalid"),
        (
            "GET",
            "/v1/jobs?queue=q&state=paused".into(),
            None,
            422,
            "invalid",
        ),
        (
            "GET",
            "/v1/jobs?queue=q&state=failed,,done".into(),
            None,
            422,
            "invalid",
        ),
        ("GET", "/v1/jobs?queue=q&limit=0".into(), None, 422, "invalid"),
        ("GET", "/v1/jobs?queue=q&limit=501".into(), None, 422, "invalid"),
        (
            "GET",
            "/v1/jobs?queue=q&limit=-1".into(),
            None,
            400,
            "bad_request",
        ),
        (
            "GET",
            "/v1/jobs?queue=q&limit=ten".into(),
            None,
            400,
            "bad_request",
        ),
        ("GET", "/v1/jobs?queue=q&cursor=xyz".into(), None, 422, "invalid"),
        (
            "GET",
            format!("/v1/jobs?queue=q&cursor={}", "A".repeat(500)),
            None,
            422,
            "invalid",
        ),
        (
            "GET",
            "/v1/jobs?queue=q&colour=red".into(),
            None,
            400,
            "bad_request",
        ),
        // Bulk actions: a queue and states are required (never "all jobs").
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(json!({"action": "delete"}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(json!({"action": "delete", "queue": "q"}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(
                json!({"action": "delete", "queue": "q", "states": []})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(
                json!({"action": "delete", "queue": "q", "states": ["paused"]})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(
                json!({"action": "purge", "queue": "q", "states": ["done"]})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(
                json!({"action": "retry", "queue": "q", "states": ["failed"], "ids": ["nope"]})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(
                json!({"action": "retry", "queue": "q", "states": ["failed"], "where": "1=1"})
                    .to_string()
                    .into(),
            ),
            422,
            "invalid",
        ),
        (
            "POST",
            "/v1/jobs/bulk".into(),
            Some(b"[1,2".to_vec()),
            400,
            "bad_request",
        ),
        // Queue settings: known fields, values in range.
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"colour": "red"}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"paused": null}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"paused": "yes"}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"max_running": 0}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"max_running": -5}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"max_running_per_key": 1_000_001}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"rate_limit": {"per_s": 0, "burst": 5}}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"rate_limit": {"per_s": 5, "burst": 0}}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"rate_limit": {"per_s": 5}}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(json!({"retention_done_ms": -1}).to_string().into()),
            422,
            "invalid",
        ),
        (
            "PATCH",
            "/v1/queues/q".into(),
            Some(b"{".to_vec()),
            400,
            "bad_request",
        ),
        (
            "PATCH",
            format!("/v1/queues/{}", "q".repeat(200)),
            Some(b"{}".to_vec()),
            422,
            "invalid",
        ),
        (
            "GET",
            format!("/v1/queues/{}", "q".repeat(200)),
            None,
            422,
            "invalid",
        ),
        ("DELETE", "/v1/queues/q".into(), None, 405, "method_not_allowed"),
        ("GET", "/v1/nothing-here".into(), None, 404, "not_found"),
        ("DELETE", "/v1/jobs".into(), None, 405, "method_not_allowed"),
        // Too large: the limit here is 64 KiB.
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                json!({"queue": "q", "payload": "x".repeat(70_000)})
                    .to_string()
                    .into(),
            ),
            413,
            "too_large",
        ),
        // Deeply nested JSON is refused by the parser's depth limit.
        (
            "POST",
            "/v1/jobs".into(),
            Some(
                format!(
                    "{{\"queue\":\"q\",\"payload\":{}{}}}",
                    "[".repeat(5000),
                    "]".repeat(5000)
                )
                .into(),
            ),
            400,
            "bad_request",
        ),
    ];
    let http = reqwest::Client::new();
    for (method, path, body, want_status, want_code) in &cases {
        let mut rb = http.request(method.parse().unwrap(), format!("{}{path}", c.api.base()));
        if let Some(b) = body {
            rb = rb.body(b.clone());
        }
        let response = rb.send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, *want_status, "{method} {path}: {body}");
        assert!(
            is_error_body(&body, want_code),
            "{method} {path}: expected {want_code}, got {body}"
        );
        assert_eq!(
            content_type.as_deref(),
            Some("application/json"),
            "{method} {path}"
        );
    }

    // Oversized bodies announced by Content-Length are refused too.
    let response = http
        .post(format!("{}/v1/jobs", c.api.base()))
        .body(vec![b' '; 200_000])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);

    // Nothing was written or changed; the coordinator and its pool are fine.
    let count: i64 = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    assert_eq!(count, 1);
    let settings: i64 = db.scalar("SELECT count(*) FROM queue_settings", &[]).await;
    assert_eq!(settings, 0, "no refused PATCH created settings");
    assert_eq!(c.api.job(running.id).await, snapshot);
    let (_, metrics) = c.api.get_text("/metrics").await;
    assert!(
        !metrics.contains("status=\"5xx\""),
        "no request was a 5xx:\n{metrics}"
    );
    let available: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("runlease_db_pool_waiting "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(available, 0.0, "no request is stuck waiting for a connection");
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
}
