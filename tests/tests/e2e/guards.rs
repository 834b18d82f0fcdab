//! One guard test per guarded statement: a call carrying lease N against the
//! same job now running under lease N+1 is refused and changes nothing. Each
//! of these fails when the `run_lease` comparison is taken out of its
//! statement (`lease_heartbeat.sql`, `lease_finish.sql`), which a stale call
//! against a job that is no longer running cannot show: `state = 'running'`
//! alone refuses those.

use runlease_protocol::JobState;
use runlease_protocol::worker::Lease;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::expire_leases;

/// A job running under lease 2, and the lease-1 token of the worker that
/// stalled past its TTL (its lease was reaped, then the job claimed again).
struct Superseded {
    stale: Lease,
    current: Lease,
}

async fn superseded(c: &TestCoordinator, db: &TestDb, queue: &str) -> Superseded {
    c.api.enqueue(queue, json!({"n": 1})).await;
    let stale = c.api.claim_one(queue, "stalled-worker").await;
    expire_leases(db, &[stale.job_id.0]).await;
    let reaped = db.store().await.reap(100).await.unwrap();
    assert_eq!(reaped.len(), 1, "the expired lease is reaped");
    assert_eq!(reaped[0].0.state, JobState::Queued);
    let current = c.api.claim_one(queue, "fresh-worker").await;
    assert_eq!(current.job_id, stale.job_id);
    assert_eq!(current.run_lease.0, stale.run_lease.0 + 1);
    Superseded { stale, current }
}

/// Everything PostgreSQL holds of a job: its row and its chronology.
async fn snapshot(db: &TestDb, id: Uuid) -> (String, String) {
    let client = db.client().await;
    let job: String = client
        .query_one("SELECT row_to_json(j)::text FROM jobs j WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    let attempts: String = client
        .query_one(
            "SELECT coalesce(json_agg(a ORDER BY run_lease), '[]')::text FROM job_attempts a WHERE job_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    (job, attempts)
}

/// The lease-N call was refused with 409 `lease_lost`, nothing changed, and
/// lease N+1 still holds the job.
async fn refused_and_unchanged(
    c: &TestCoordinator,
    db: &TestDb,
    s: &Superseded,
    before: &(String, String),
    what: &str,
) {
    assert_eq!(
        &snapshot(db, s.current.job_id.0).await,
        before,
        "{what} changed the job"
    );
    assert_eq!(
        c.api.heartbeat(&s.current).await,
        "renewed",
        "{what}: lease N+1 still holds the job"
    );
}

fn lost(status: u16, body: &Value, what: &str) {
    assert_eq!(status, 409, "{what}: {body}");
    assert_eq!(body["error"]["code"], "lease_lost", "{what}: {body}");
}

#[tokio::test]
async fn a_stale_heartbeat_without_progress_renews_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let s = superseded(&c, &db, "q").await;
    let before = snapshot(&db, s.current.job_id.0).await;
    assert_eq!(c.api.heartbeat(&s.stale).await, "lease_lost");
    refused_and_unchanged(&c, &db, &s, &before, "heartbeat").await;
}

#[tokio::test]
async fn a_stale_heartbeat_with_progress_saves_no_checkpoint() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let s = superseded(&c, &db, "q").await;
    let before = snapshot(&db, s.current.job_id.0).await;
    let (status, body) = c
        .api
        .post(
            "/v1/heartbeat",
            &json!({"leases": [{"lease_token": s.stale.lease_token, "progress": {"step": "stale"}}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"][0]["status"], "lease_lost", "{body}");
    refused_and_unchanged(&c, &db, &s, &before, "heartbeat with progress").await;
    assert_eq!(c.api.job(s.current.job_id).await.progress, None);
}

#[tokio::test]
async fn a_stale_complete_lands_no_result() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let s = superseded(&c, &db, "q").await;
    let before = snapshot(&db, s.current.job_id.0).await;
    let (status, body) = c.api.complete(&s.stale, json!("stale result")).await;
    lost(status, &body, "complete");
    refused_and_unchanged(&c, &db, &s, &before, "complete").await;
    let (status, body) = c.api.complete(&s.current, json!("fresh result")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], "fresh result");
}

#[tokio::test]
async fn a_stale_fail_requeues_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let s = superseded(&c, &db, "q").await;
    let before = snapshot(&db, s.current.job_id.0).await;
    let (status, body) = c.api.fail(&s.stale, "stale failure", true, Some(0)).await;
    lost(status, &body, "retryable fail");
    let (status, body) = c.api.fail(&s.stale, "stale failure", false, None).await;
    lost(status, &body, "final fail");
    refused_and_unchanged(&c, &db, &s, &before, "fail").await;
    assert_eq!(c.api.job(s.current.job_id).await.state, JobState::Running);
}

#[tokio::test]
async fn a_stale_release_hands_back_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let s = superseded(&c, &db, "q").await;
    let before = snapshot(&db, s.current.job_id.0).await;
    let (status, body) = c.api.release(&s.stale, Some(json!({"step": "stale"}))).await;
    lost(status, &body, "release");
    refused_and_unchanged(&c, &db, &s, &before, "release").await;
}

#[tokio::test]
async fn stale_items_of_a_finish_batch_change_nothing_and_the_current_ones_land() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let s = superseded(&c, &db, "q").await;
    let before = snapshot(&db, s.current.job_id.0).await;
    let stale = &s.stale.lease_token;
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({"items": [
                {"lease_token": stale, "action": "complete", "result": "stale"},
                {"lease_token": stale, "action": "fail", "error": "stale", "retryable": true},
                {"lease_token": stale, "action": "release", "progress": {"step": "stale"}},
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for item in body["items"].as_array().unwrap() {
        assert_eq!(item["status"], "lease_lost", "{body}");
        assert_eq!(
            item["state"], "running",
            "a stale item learns where its job is: {body}"
        );
    }
    refused_and_unchanged(&c, &db, &s, &before, "finish").await;

    // The same batch with the current lease first: it lands, the stale ones do not.
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({"items": [
                {"lease_token": stale, "action": "fail", "error": "stale", "retryable": false},
                {"lease_token": s.current.lease_token, "action": "complete", "result": "fresh"},
                {"lease_token": stale, "action": "complete", "result": "stale"},
            ]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let statuses: Vec<&str> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["lease_lost", "ok", "lease_lost"], "{body}");
    let job = c.api.job(s.current.job_id).await;
    assert_eq!(job.state, JobState::Done);
    assert_eq!(job.result, Some(json!("fresh")));
    let leases: Vec<i64> = job.attempts.iter().map(|a| a.run_lease.0).collect();
    assert_eq!(leases, [1, 2], "one chronology row per ended lease");
}

#[tokio::test]
async fn the_reaper_leaves_a_job_whose_lease_was_renewed_under_a_newer_lease() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let s = superseded(&c, &db, "q").await;
    let before = snapshot(&db, s.current.job_id.0).await;
    // Lease 1 expired long ago (its attempt is recorded); lease 2 is live.
    let reaped = db.store().await.reap(100).await.unwrap();
    assert!(reaped.is_empty(), "{reaped:?}");
    refused_and_unchanged(&c, &db, &s, &before, "reap").await;
}
