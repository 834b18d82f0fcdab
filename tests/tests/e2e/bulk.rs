//! Bulk actions: each matching job gets its single-job rule, in bounded
//! chunks; a repeat changes nothing; filters are required.

use std::time::Duration;

use runlease_protocol::JobState;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_bulk_retry_of_5000_failed_jobs_changes_5000_and_a_second_changes_none() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    db.insert_terminal_jobs("emails", JobState::Failed, 5000, HOUR)
        .await;
    let done = db.insert_terminal_jobs("emails", JobState::Done, 50, HOUR).await;
    db.insert_terminal_jobs("other", JobState::Failed, 30, HOUR).await;
    let body = json!({"action": "retry", "queue": "emails", "states": ["failed"]});
    let (status, first) = c.api.post("/v1/jobs/bulk", &body).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first, json!({"matched": 5000, "changed": 5000}));
    let (status, second) = c.api.post("/v1/jobs/bulk", &body).await;
    assert_eq!(status, 200);
    assert_eq!(second, json!({"matched": 0, "changed": 0}));
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM jobs WHERE queue = 'emails' AND state = 'queued' AND attempt = 0",
            &[]
        )
        .await,
        5000
    );
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM jobs WHERE queue = 'other' AND state = 'failed'",
            &[]
        )
        .await,
        30,
        "another queue is untouched"
    );
    // A retry of done jobs matches them and changes none: retry's rule.
    let (_, refused) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "retry", "queue": "emails", "states": ["done"]}),
        )
        .await;
    assert_eq!(refused, json!({"matched": 50, "changed": 0}));
    assert_eq!(c.api.job(done[0]).await.state, JobState::Done);
    // Retried jobs are claimable, and the queue figures follow.
    assert_eq!(c.api.claim("emails", "w", 10).await.len(), 10);
    let (_, q) = c.api.get("/v1/queues/emails").await;
    assert_eq!(q["counts"]["failed"], json!(0));
    assert_eq!(q["counts"]["queued"], json!(4990));
    assert_eq!(q["counts"]["running"], json!(10));
    assert_eq!(
        c.api
            .metric(r#"runlease_bulk_changed_total{action="retry"}"#)
            .await,
        5000.0
    );
}

#[tokio::test]
async fn bulk_cancel_and_delete_follow_their_single_job_rules() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut queued = Vec::new();
    for i in 0..6 {
        queued.push(c.api.enqueue("q", json!(i)).await.id);
    }
    let leases = c.api.claim("q", "w", 2).await;
    let running: Vec<_> = leases.iter().map(|l| l.job_id).collect();
    let (status, cancel) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "cancel", "queue": "q", "states": ["queued", "running"]}),
        )
        .await;
    assert_eq!(status, 200, "{cancel}");
    assert_eq!(cancel, json!({"matched": 6, "changed": 6}));
    for id in &running {
        let job = c.api.job(id).await;
        assert_eq!(
            job.state,
            JobState::Running,
            "a running job is only asked to stop"
        );
        assert!(job.cancel_requested);
    }
    assert_eq!(c.api.heartbeat(&leases[0]).await, "cancel_requested");
    // Deleting running or cancelled-requested jobs is refused; only
    // terminal jobs go.
    let (_, delete) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "delete", "queue": "q", "states": ["running", "cancelled"]}),
        )
        .await;
    assert_eq!(delete, json!({"matched": 6, "changed": 4}));
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobs WHERE queue = 'q'", &[])
            .await,
        2
    );
    // The cancelled workers' acknowledgements still land.
    assert_eq!(c.api.release(&leases[0], None).await.0, 200);
    assert_eq!(c.api.job(running[0]).await.state, JobState::Cancelled);
}

#[tokio::test]
async fn a_bulk_action_by_ids_and_creation_time_touches_only_those_jobs() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let failed = db.insert_terminal_jobs("q", JobState::Failed, 10, HOUR).await;
    let chosen: Vec<String> = failed[..3].iter().map(|id| id.to_string()).collect();
    let (_, by_ids) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "retry", "queue": "q", "states": ["failed"], "ids": chosen}),
        )
        .await;
    assert_eq!(by_ids, json!({"matched": 3, "changed": 3}));
    // Every inserted job was created more than an hour ago.
    let (_, later) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "delete", "queue": "q", "states": ["failed"],
                    "created_before": "2000-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(later, json!({"matched": 0, "changed": 0}));
    let (_, rest) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "delete", "queue": "q", "states": ["failed"]}),
        )
        .await;
    assert_eq!(rest, json!({"matched": 7, "changed": 7}));
    assert_eq!(db.scalar("SELECT count(*) FROM jobs", &[]).await, 3);
    assert_eq!(
        db.scalar("SELECT count(*) FROM job_attempts", &[]).await,
        3,
        "attempts went with their jobs"
    );
}

#[tokio::test]
async fn a_bulk_action_naming_too_many_jobs_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let failed = db.insert_terminal_jobs("q", JobState::Failed, 3, HOUR).await;
    let mut ids: Vec<String> = failed.iter().map(|id| id.to_string()).collect();
    ids.extend((0..10_000).map(|_| uuid::Uuid::now_v7().to_string()));
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "retry", "queue": "q", "states": ["failed"], "ids": ids}),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], json!("invalid"));
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobs WHERE state = 'failed'", &[])
            .await,
        3
    );
}
