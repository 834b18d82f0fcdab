//! Queue settings: kept in PostgreSQL, set before a queue's first job, seen
//! by every replica; a paused queue takes enqueues and hands out nothing,
//! not even to claims parked before the pause, until it is resumed.

use std::time::{Duration, Instant};

use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

/// Parked claims re-check PostgreSQL only this rarely, so a claim answered
/// sooner was woken, not found by its timer.
fn slow_recheck(cfg: &mut runlease_coordinator::config::Config) {
    cfg.leases.claim_recheck = std::time::Duration::from_millis(120_000);
}

async fn wait_for_parked(api: &runlease_tests::Api, n: f64) {
    let started = Instant::now();
    while api.metric("runlease_claim_waiters").await < n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the claim did not park"
        );
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn a_paused_queue_parks_a_long_poll_claim_until_resume_on_every_replica() {
    let db = TestDb::new().await;
    let a = TestCoordinator::start_with(&db, slow_recheck).await;
    let b = TestCoordinator::start_with(&db, slow_recheck).await;
    // A claim parked on B before the pause, on an empty queue.
    let parked = {
        let api = b.api.clone();
        tokio::spawn(async move {
            let leases = api.claim_wait("emails", "w", 1, 60_000).await;
            (leases, Instant::now())
        })
    };
    wait_for_parked(&b.api, 1.0).await;
    let (status, paused) = a.api.patch("/v1/queues/emails", &json!({"paused": true})).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["settings"]["paused"], json!(true));
    // Enqueues are accepted and wake the parked claim, which finds the
    // queue paused and stays parked.
    let job = a.api.enqueue("emails", json!("hello")).await;
    assert_eq!(job.state, runlease_protocol::JobState::Queued);
    assert!(a.api.claim("emails", "w2", 5).await.is_empty(), "no claim on A");
    assert!(b.api.claim("emails", "w3", 5).await.is_empty(), "no claim on B");
    assert!(!parked.is_finished(), "the parked claim got nothing");
    wait_for_parked(&b.api, 1.0).await;
    let (_, q) = b.api.get("/v1/queues/emails").await;
    assert_eq!(q["settings"]["paused"], json!(true));
    assert_eq!(q["counts"]["queued"], json!(1));

    let resumed_at = Instant::now();
    let (status, _) = a.api.patch("/v1/queues/emails", &json!({"paused": false})).await;
    assert_eq!(status, 200);
    let (leases, answered_at) = parked.await.unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].job_id, job.id);
    assert!(
        answered_at.duration_since(resumed_at) < Duration::from_secs(30),
        "woken by the resume, not by its 120 s re-check"
    );
}

#[tokio::test]
async fn settings_are_kept_before_a_queues_first_job_and_change_field_by_field() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let (status, fresh) = c.api.get("/v1/queues/new-queue").await;
    assert_eq!(status, 200);
    assert_eq!(fresh["counts"]["queued"], json!(0));
    assert_eq!(
        fresh["settings"],
        json!({"paused": false, "max_running": null, "max_running_per_key": null,
               "rate_limit": null, "retention_done_ms": null, "retention_failed_ms": null,
               "max_attempts": null, "backoff": null, "retry_window_ms": null, "dead_letter_queue": null})
    );
    let (status, set) = c
        .api
        .patch(
            "/v1/queues/new-queue",
            &json!({"max_running": 10, "max_running_per_key": 2,
                    "rate_limit": {"per_s": 20.0, "burst": 5}, "retention_done_ms": 60000}),
        )
        .await;
    assert_eq!(status, 200, "{set}");
    // A field left out is unchanged; null clears it.
    let (_, set) = c
        .api
        .patch(
            "/v1/queues/new-queue",
            &json!({"max_running": null, "paused": true}),
        )
        .await;
    assert_eq!(
        set["settings"],
        json!({"paused": true, "max_running": null, "max_running_per_key": 2,
               "rate_limit": {"per_s": 20.0, "burst": 5}, "retention_done_ms": 60000,
               "retention_failed_ms": null, "max_attempts": null, "backoff": null,
               "retry_window_ms": null, "dead_letter_queue": null})
    );
    // Listed among the queues without a job, and kept across a restart.
    let (_, all) = c.api.get("/v1/queues").await;
    assert!(
        all["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["queue"] == json!("new-queue"))
    );
    c.stop().await.unwrap();
    let again = TestCoordinator::start(&db).await;
    let (_, after) = again.api.get("/v1/queues/new-queue").await;
    assert_eq!(after["settings"], set["settings"]);
}
