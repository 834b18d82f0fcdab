//! Long-polls: parked claims wake on a local enqueue; parked reads wake on a
//! terminal state; both answer normally when their wait runs out.

use std::time::{Duration, Instant};

use runlease_protocol::JobState;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_parked_claim_wakes_on_a_local_enqueue() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let api = c.api.clone();
    let parked = tokio::spawn(async move {
        let started = Instant::now();
        let leases = api.claim_wait("wake", "w", 1, 30_000).await;
        (leases, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let enqueued_at = Instant::now();
    let job = c.api.enqueue("wake", json!("hello")).await;
    let (leases, waited) = parked.await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].job_id, job.id);
    assert!(
        waited < Duration::from_secs(20),
        "the claim was woken, not timed out ({waited:?})"
    );
    assert!(enqueued_at.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn an_empty_claim_answers_after_its_wait() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let started = Instant::now();
    let leases = c.api.claim_wait("empty", "w", 3, 300).await;
    assert!(leases.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn a_parked_claim_finds_a_job_that_becomes_due() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut req = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("later").unwrap(),
        json!(1),
    );
    req.delay_ms = Some(500);
    let job = c.api.enqueue_with(req).await;
    assert!(c.api.claim("later", "w", 1).await.is_empty(), "not due yet");
    // No wake-up is sent when a job becomes due: the timer re-check finds it.
    let leases = c.api.claim_wait("later", "w", 1, 10_000).await;
    assert_eq!(leases.first().map(|l| l.job_id), Some(job.id));
}

#[tokio::test]
async fn a_parked_read_answers_when_the_job_is_done() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("q", json!(1)).await;
    let api = c.api.clone();
    let waiter = tokio::spawn(async move {
        let started = Instant::now();
        let (status, body) = api.get(&format!("/v1/jobs/{}?wait_ms=30000", job.id)).await;
        (status, body, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(c.api.complete(&lease, json!("r")).await.0, 200);
    let (status, body, waited) = waiter.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["state"], json!(JobState::Done));
    assert!(
        waited < Duration::from_secs(20),
        "woken by the completion ({waited:?})"
    );

    // A read of a job that stays running answers as it is after the wait.
    let other = c.api.enqueue("q", json!(2)).await;
    let (status, body) = c.api.get(&format!("/v1/jobs/{}?wait_ms=200", other.id)).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("queued")));
}
