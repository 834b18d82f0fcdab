//! Restarts and shutdown: a coordinator restarted over its database loses and
//! changes nothing; SIGTERM drains and exits 0.

use std::time::{Duration, Instant};

use runlease_tests::{CoordinatorProcess, TestCoordinator, TestDb};
use serde_json::json;

async fn snapshot(db: &TestDb) -> Vec<String> {
    db.client()
        .await
        .query("SELECT row_to_json(j)::text FROM jobs j ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .chain(
            db.client()
                .await
                .query(
                    "SELECT row_to_json(a)::text FROM job_attempts a ORDER BY job_id, run_lease",
                    &[],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0)),
        )
        .collect()
}

#[tokio::test]
async fn a_restart_over_an_existing_database_loses_and_changes_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for i in 0..5 {
        c.api.enqueue("q", json!(i)).await;
    }
    let done = c.api.claim_one("q", "w").await;
    c.api.complete(&done, json!("ok")).await;
    let failed = c.api.claim_one("q", "w").await;
    c.api.fail(&failed, "nope", false, None).await;
    let held = c.api.claim_one("q", "w").await;
    let before = snapshot(&db).await;
    c.stop().await.unwrap();

    let c = TestCoordinator::start(&db).await;
    assert_eq!(snapshot(&db).await, before, "a restart changes no row");
    let (_, body) = c.api.get("/v1/queues").await;
    assert_eq!(body["queues"][0]["counts"]["queued"], 2);
    // A lease handed out before the restart still works (same secret).
    assert_eq!(c.api.heartbeat(&held).await, "renewed");
    assert_eq!(c.api.complete(&held, json!("after restart")).await.0, 200);
    c.stop().await.unwrap();
}

#[tokio::test]
async fn shutdown_answers_parked_claims_and_finishes_in_flight_requests() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let api = c.api.clone();
    let parked = tokio::spawn(async move { api.claim_wait("idle", "w", 1, 60_000).await });
    let api = c.api.clone();
    let created = c.api.enqueue("q", json!(1)).await;
    let read = tokio::spawn(async move { api.get(&format!("/v1/jobs/{}?wait_ms=60000", created.id)).await });
    // Both are parked (each looked once and waits) when shutdown begins.
    c.api.until_claims_parked(1).await;
    c.api.until_reads_parked(1).await;
    let started = Instant::now();
    c.stop().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "shutdown did not wait out the long-polls"
    );
    assert!(
        parked.await.unwrap().is_empty(),
        "a parked claim is answered with an empty list"
    );
    let (status, body) = read.await.unwrap();
    assert_eq!((status, body["state"].as_str()), (200, Some("queued")));
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let db = TestDb::new().await;
    let mut process = CoordinatorProcess::start(&db, &[]).await;
    let api = process.api.clone();
    let parked = tokio::spawn(async move { api.claim_wait("q", "w", 1, 60_000).await });
    process.api.until_claims_parked(1).await;
    process.terminate();
    let status = tokio::time::timeout(Duration::from_secs(20), process.child.wait())
        .await
        .expect("the coordinator did not exit after SIGTERM")
        .unwrap();
    assert_eq!(status.code(), Some(0), "exit status after SIGTERM");
    assert!(
        parked.await.unwrap().is_empty(),
        "the parked claim was answered with an empty list"
    );
}
