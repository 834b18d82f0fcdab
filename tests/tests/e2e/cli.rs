//! The `runlease` CLI against a real coordinator: what a shell script sees.

use runlease_tests::cli::{json_out, refused, runlease};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

#[tokio::test]
async fn the_cli_drives_a_job_and_prints_what_the_protocol_answers() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();

    let out = runlease(
        &url,
        &[
            "--json",
            "enqueue",
            "mail",
            r#"{"to":"x@example.com"}"#,
            "--priority=-3",
            "--max-attempts",
            "2",
        ],
        None,
    )
    .await;
    let job = json_out(&out);
    assert_eq!(job["payload"], json!({"to": "x@example.com"}));
    assert_eq!(
        (job["priority"].as_i64(), job["max_attempts"].as_i64()),
        (Some(-3), Some(2))
    );
    let id = job["id"].as_str().unwrap().to_owned();

    // --json prints the job exactly as the protocol answers it.
    let (_, from_api) = c.api.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(
        json_out(&runlease(&url, &["--json", "get", &id], None).await),
        from_api
    );

    // Payload from standard input; table output by default.
    let out = runlease(&url, &["enqueue", "mail"], Some(r#"{"from":"stdin"}"#)).await;
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("state") && table.contains("queued") && table.contains(r#"{"from":"stdin"}"#),
        "{table}"
    );

    // wait: shows progress, exits 0 once done.
    let api = c.api.clone();
    let waiter = {
        let url = url.clone();
        let id = id.clone();
        tokio::spawn(async move { runlease(&url, &["wait", &id, "--wait-ms", "30000"], None).await })
    };
    let lease = api.claim_one("mail", "w").await;
    assert_eq!(lease.job_id.to_string(), id);
    api.post(
        "/v1/heartbeat",
        &json!({"leases": [{"lease_token": lease.lease_token, "progress": {"pct": 50}}]}),
    )
    .await;
    api.complete(&lease, json!("sent")).await;
    let out = waiter.await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("done"));

    // cancel, retry, queues.
    let second = json_out(&runlease(&url, &["--json", "enqueue", "mail", "2"], None).await);
    let second_id = second["id"].as_str().unwrap().to_owned();
    assert_eq!(
        json_out(&runlease(&url, &["--json", "cancel", &second_id], None).await)["state"],
        "cancelled"
    );
    assert_eq!(
        json_out(&runlease(&url, &["--json", "retry", &second_id], None).await)["state"],
        "queued"
    );
    let mut queues = json_out(&runlease(&url, &["--json", "queues"], None).await);
    let mut from_api = c.api.get("/v1/queues").await.1;
    // The age moves between the two reads; everything else must match.
    queues["queues"][0]["oldest_queued_age_ms"] = Value::Null;
    from_api["queues"][0]["oldest_queued_age_ms"] = Value::Null;
    assert_eq!(queues, from_api);
    let out = runlease(&url, &["queues"], None).await;
    assert!(String::from_utf8_lossy(&out.stdout).contains("mail"));

    // A wait on a job that ends cancelled exits 2.
    let third = json_out(&runlease(&url, &["--json", "enqueue", "mail", "3"], None).await);
    let third_id = third["id"].as_str().unwrap().to_owned();
    runlease(&url, &["cancel", &third_id], None).await;
    assert_eq!(
        runlease(&url, &["wait", &third_id], None).await.status.code(),
        Some(2)
    );
}

#[tokio::test]
async fn cli_errors_exit_nonzero_with_one_line() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    let unknown = uuid::Uuid::now_v7().to_string();
    assert!(refused(&runlease(&url, &["get", &unknown], None).await).contains("not found"));
    assert!(refused(&runlease(&url, &["get", "nope"], None).await).contains("not a job id"));
    assert!(
        refused(&runlease(&url, &["enqueue", "q", "{bad json"], None).await)
            .contains("payload is not valid JSON")
    );
    assert!(refused(&runlease(&url, &["enqueue", "bad queue", "1"], None).await).contains("queue"));
    let done = c.api.enqueue("q", json!(1)).await;
    runlease(&url, &["cancel", &done.id.to_string()], None).await;
    assert!(refused(&runlease(&url, &["cancel", &done.id.to_string()], None).await).contains("conflict"));
    // Usage errors exit 1 with one line, like every other error.
    assert!(refused(&runlease(&url, &["frobnicate"], None).await).contains("frobnicate"));
    // Nobody listens here.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = refused(&runlease(&format!("http://127.0.0.1:{port}"), &["queues"], None).await);
    assert!(err.contains("cannot reach the coordinator"), "{err}");
}
