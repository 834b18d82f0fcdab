//! Every transition of the job lifecycle (docs/protocol.md), through the HTTP protocol.

use runlease_protocol::worker::HeartbeatStatus;
use runlease_protocol::{AttemptOutcome, Job, JobState, RunLease};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

use crate::{attempts_with, expire_leases};

fn job(body: Value) -> Job {
    serde_json::from_value(body).unwrap()
}

#[tokio::test]
async fn enqueue_claim_heartbeat_complete() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("emails", json!({"to": "a@example.com"})).await;
    assert_eq!(created.state, JobState::Queued);
    assert_eq!(created.run_lease, RunLease(0));
    assert_eq!(created.attempt, 0);
    assert_eq!(created.max_attempts, 4);
    assert!(created.attempts.is_empty());

    let lease = c.api.claim_one("emails", "w1").await;
    assert_eq!(lease.job_id, created.id);
    assert_eq!(lease.run_lease, RunLease(1));
    assert_eq!(lease.attempt, 1);
    assert_eq!(lease.payload, json!({"to": "a@example.com"}));
    assert_eq!(lease.lease_ttl_ms, 15_000);
    assert_eq!(lease.heartbeat_interval_ms, 5_000);
    assert_eq!(lease.timeout_ms, 300_000);

    let running = c.api.job(created.id).await;
    assert_eq!(running.state, JobState::Running);
    assert_eq!(
        running.attempts.len(),
        1,
        "the running attempt is in the chronology"
    );
    assert_eq!(running.attempts[0].outcome, None);

    let (status, body) = c
        .api
        .post(
            "/v1/heartbeat",
            &json!({"leases": [{"lease_token": lease.lease_token, "progress": {"step": 2}}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(body["leases"][0]["status"], "renewed");
    assert_eq!(body["leases"][0]["job_id"], json!(created.id));
    assert_eq!(c.api.job(created.id).await.progress, Some(json!({"step": 2})));

    let (status, body) = c.api.complete(&lease, json!({"sent": true})).await;
    assert_eq!(status, 200, "{body}");
    let done = job(body);
    assert_eq!(done.state, JobState::Done);
    assert_eq!(done.result, Some(json!({"sent": true})));
    assert!(done.finished_at.is_some());
    assert_eq!(done.attempts.len(), 1);
    assert_eq!(done.attempts[0].outcome, Some(AttemptOutcome::Completed));
    assert_eq!(done.attempts[0].worker_id.as_str(), "w1");
    assert!(
        c.api.claim("emails", "w1", 10).await.is_empty(),
        "a done job is not claimable"
    );
}

#[tokio::test]
async fn fail_with_budget_requeues_with_backoff_and_without_budget_fails() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut req = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("q").unwrap(),
        json!(1),
    );
    req.max_attempts = Some(2);
    let created = c.api.enqueue_with(req).await;

    // Default backoff: queued again, due within base (1 s) of now, full jitter.
    let lease = c.api.claim_one("q", "w1").await;
    let (status, body) = c.api.fail(&lease, "boom", true, None).await;
    assert_eq!(status, 200, "{body}");
    let retried = job(body);
    assert_eq!(retried.state, JobState::Queued);
    assert_eq!(retried.error.as_deref(), Some("boom"));
    let delay = retried.run_at - retried.updated_at;
    assert!(
        delay >= chrono::Duration::zero() && delay <= chrono::Duration::milliseconds(1000),
        "{delay}"
    );

    // retry_after_ms from the worker decides the delay.
    let client = db.client().await;
    client
        .execute("UPDATE jobs SET run_at = now() WHERE id = $1", &[&created.id.0])
        .await
        .unwrap();
    let lease = c.api.claim_one("q", "w1").await;
    assert_eq!(lease.attempt, 2);
    assert_eq!(lease.run_lease, RunLease(2));
    let (status, body) = c.api.fail(&lease, "boom again", true, Some(60_000)).await;
    assert_eq!(status, 200);
    let failed = job(body);
    assert_eq!(
        failed.state,
        JobState::Failed,
        "second failure of two attempts spends the budget"
    );
    assert_eq!(attempts_with(&db, created.id.0, "failed").await, 2);
}

#[tokio::test]
async fn not_retryable_failure_fails_at_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(null)).await;
    let lease = c.api.claim_one("q", "w1").await;
    let (status, body) = c.api.fail(&lease, "bad payload", false, None).await;
    assert_eq!(status, 200);
    let failed = job(body);
    assert_eq!(failed.state, JobState::Failed);
    assert_eq!(failed.attempt, 1);
    assert_eq!(
        c.api.job(created.id).await.attempts[0].error.as_deref(),
        Some("bad payload")
    );
}

#[tokio::test]
async fn retry_budget_ends_in_failed_with_the_chronology_recorded() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut req = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("q").unwrap(),
        json!({}),
    );
    req.max_attempts = Some(3);
    let created = c.api.enqueue_with(req).await;
    for n in 1..=3 {
        let lease = c.api.claim_one("q", "w1").await;
        assert_eq!(lease.attempt, n);
        let (status, body) = c.api.fail(&lease, &format!("failure {n}"), true, Some(0)).await;
        assert_eq!(status, 200);
        let expected = if n < 3 { JobState::Queued } else { JobState::Failed };
        assert_eq!(job(body).state, expected);
    }
    let failed = c.api.job(created.id).await;
    assert_eq!(failed.state, JobState::Failed);
    assert_eq!(failed.attempt, 3);
    let chronology: Vec<_> = failed
        .attempts
        .iter()
        .map(|a| (a.run_lease.0, a.outcome, a.error.clone()))
        .collect();
    assert_eq!(
        chronology,
        vec![
            (1, Some(AttemptOutcome::Failed), Some("failure 1".to_owned())),
            (2, Some(AttemptOutcome::Failed), Some("failure 2".to_owned())),
            (3, Some(AttemptOutcome::Failed), Some("failure 3".to_owned())),
        ]
    );
    let states: Vec<String> = db
        .client()
        .await
        .query(
            "SELECT state_after::text FROM job_attempts WHERE job_id = $1 ORDER BY run_lease",
            &[&created.id.0],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(states, ["queued", "queued", "failed"]);
    assert!(c.api.claim("q", "w1", 1).await.is_empty());
}

#[tokio::test]
async fn release_charges_no_attempt_and_keeps_the_checkpoint() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!({"n": 1})).await;
    let lease = c.api.claim_one("q", "lambda-1").await;
    let (status, body) = c.api.release(&lease, Some(json!({"done_pages": 7}))).await;
    assert_eq!(status, 200, "{body}");
    let released = job(body);
    assert_eq!(released.state, JobState::Queued);
    assert_eq!(released.attempt, 0, "a release gives its attempt back");
    assert!(released.run_at <= released.updated_at, "claimable again at once");

    let next = c.api.claim_one("q", "lambda-2").await;
    assert_eq!(next.job_id, created.id);
    assert_eq!(next.attempt, 1);
    assert_eq!(next.run_lease, RunLease(2), "run_lease only grows");
    assert_eq!(next.progress, Some(json!({"done_pages": 7})));
    assert_eq!(attempts_with(&db, created.id.0, "released").await, 1);
}

#[tokio::test]
async fn cancel_of_a_queued_job_is_immediate_and_terminal_jobs_conflict() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(1)).await;
    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/cancel", created.id), &json!({}))
        .await;
    assert_eq!(status, 200);
    let cancelled = job(body);
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(cancelled.finished_at.is_some());
    assert!(c.api.claim("q", "w", 1).await.is_empty());

    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/cancel", created.id), &json!({}))
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "conflict");
}

#[tokio::test]
async fn cancel_of_a_running_job_reaches_the_worker_through_its_heartbeat() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w1").await;
    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/cancel", created.id), &json!({}))
        .await;
    assert_eq!(status, 200);
    let requested = job(body);
    assert_eq!(
        requested.state,
        JobState::Running,
        "a running job runs until its worker stops"
    );
    assert!(requested.cancel_requested);

    assert_eq!(c.api.heartbeat(&lease).await, "cancel_requested");
    // The worker acknowledges by failing the attempt.
    let (status, body) = c.api.fail(&lease, "cancelled by request", true, None).await;
    assert_eq!(status, 200);
    let cancelled = job(body);
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert_eq!(cancelled.attempts[0].outcome, Some(AttemptOutcome::Cancelled));
}

#[tokio::test]
async fn a_cancelled_running_job_acknowledged_by_release_is_cancelled() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w1").await;
    c.api
        .post(&format!("/v1/jobs/{}/cancel", created.id), &json!({}))
        .await;
    let (status, body) = c.api.release(&lease, None).await;
    assert_eq!(status, 200);
    assert_eq!(job(body).state, JobState::Cancelled);
}

#[tokio::test]
async fn a_complete_after_a_cancel_request_still_lands_as_done() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w1").await;
    c.api
        .post(&format!("/v1/jobs/{}/cancel", created.id), &json!({}))
        .await;
    let (status, body) = c.api.complete(&lease, json!("finished anyway")).await;
    assert_eq!(status, 200);
    let done = job(body);
    assert_eq!(done.state, JobState::Done);
    assert_eq!(done.result, Some(json!("finished anyway")));
}

#[tokio::test]
async fn the_reaper_finds_an_expired_cancel_requested_lease_and_cancels() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(1)).await;
    let _lease = c.api.claim_one("q", "w1").await;
    c.api
        .post(&format!("/v1/jobs/{}/cancel", created.id), &json!({}))
        .await;
    expire_leases(&db, &[created.id.0]).await;
    let report = crate::reaping::reap_once(&db).await;
    assert_eq!(report.cancelled, 1);
    assert_eq!(c.api.job(created.id).await.state, JobState::Cancelled);
}

#[tokio::test]
async fn expired_leases_are_requeued_with_budget_and_failed_without() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut req = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("q").unwrap(),
        json!(1),
    );
    req.max_attempts = Some(2);
    let created = c.api.enqueue_with(req).await;

    let _first = c.api.claim_one("q", "w1").await;
    expire_leases(&db, &[created.id.0]).await;
    let report = crate::reaping::reap_once(&db).await;
    assert_eq!(report.requeued, 1);
    let requeued = c.api.job(created.id).await;
    assert_eq!(requeued.state, JobState::Queued);
    assert_eq!(requeued.attempt, 1, "an expired lease is charged");
    assert_eq!(requeued.attempts[0].outcome, Some(AttemptOutcome::LeaseExpired));

    let second = c.api.claim_one("q", "w2").await;
    assert_eq!(second.attempt, 2);
    expire_leases(&db, &[created.id.0]).await;
    let report = crate::reaping::reap_once(&db).await;
    assert_eq!(report.failed, 1);
    let failed = c.api.job(created.id).await;
    assert_eq!(failed.state, JobState::Failed);
    assert_eq!(attempts_with(&db, created.id.0, "lease_expired").await, 2);
}

#[tokio::test]
async fn admin_retry_requeues_failed_and_cancelled_jobs_with_a_fresh_budget() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let created = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w1").await;
    c.api.fail(&lease, "permanent", false, None).await;

    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/retry", created.id), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let retried = job(body);
    assert_eq!(retried.state, JobState::Queued);
    assert_eq!(retried.attempt, 0);
    assert_eq!(retried.run_lease, RunLease(1), "retry does not touch run_lease");
    let again = c.api.claim_one("q", "w1").await;
    assert_eq!(again.run_lease, RunLease(2));

    // Running and done jobs cannot be retried.
    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/retry", created.id), &json!({}))
        .await;
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "conflict");

    // A cancelled job can.
    let other = c.api.enqueue("q2", json!(2)).await;
    c.api
        .post(&format!("/v1/jobs/{}/cancel", other.id), &json!({}))
        .await;
    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/retry", other.id), &json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(job(body).state, JobState::Queued);
    assert_eq!(c.api.claim_one("q2", "w1").await.job_id, other.id);
}

#[tokio::test]
async fn enqueue_failed_jobs_stay_claimable_and_cancellable() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let a = c.api.enqueue("q", json!("a")).await;
    let b = c.api.enqueue("q", json!("b")).await;
    // What a failed wake-up publish leaves behind.
    db.execute_marked(
        "UPDATE jobs SET state = 'enqueue_failed' WHERE id = ANY($1)",
        &[&vec![a.id.0, b.id.0]],
    )
    .await;
    let lease = c.api.claim_one("q", "w1").await;
    assert_eq!(lease.job_id, a.id);
    let (status, body) = c.api.post(&format!("/v1/jobs/{}/cancel", b.id), &json!({})).await;
    assert_eq!(status, 200);
    assert_eq!(job(body).state, JobState::Cancelled);
}

#[tokio::test]
async fn priority_then_due_time_orders_claims_and_future_jobs_wait() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let q = runlease_protocol::QueueName::new("q").unwrap();
    let mut low = runlease_protocol::producer::EnqueueJobRequest::new(q.clone(), json!("low"));
    low.priority = Some(10);
    let low = c.api.enqueue_with(low).await;
    let mut later = runlease_protocol::producer::EnqueueJobRequest::new(q.clone(), json!("later"));
    later.delay_ms = Some(3_600_000);
    c.api.enqueue_with(later).await;
    let mut high = runlease_protocol::producer::EnqueueJobRequest::new(q.clone(), json!("high"));
    high.priority = Some(-5);
    let high = c.api.enqueue_with(high).await;
    let leases = c.api.claim("q", "w", 10).await;
    let order: Vec<_> = leases.iter().map(|l| l.job_id).collect();
    assert_eq!(order, vec![high.id, low.id], "the delayed job is not due");
}

#[tokio::test]
async fn a_claim_across_queues_takes_the_best_jobs_of_all_of_them_in_order() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut ids = std::collections::HashMap::new();
    for (queue, priority) in [("a", 5), ("a", -1), ("b", 0), ("b", 7), ("b", -3), ("other", -9)] {
        let q = runlease_protocol::QueueName::new(queue).unwrap();
        let mut req = runlease_protocol::producer::EnqueueJobRequest::new(q, json!(priority));
        req.priority = Some(priority);
        ids.insert(c.api.enqueue_with(req).await.id, format!("{queue}{priority}"));
    }
    let claim =
        |max_jobs: u32| json!({"queues": ["b", "a"], "worker_id": "w", "max_jobs": max_jobs, "wait_ms": 0});
    let names = |body: serde_json::Value| -> Vec<String> {
        body["leases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                ids[&l["job_id"]
                    .as_str()
                    .unwrap()
                    .parse::<runlease_protocol::JobId>()
                    .unwrap()]
                    .clone()
            })
            .collect()
    };
    let (status, first) = c.api.post("/v1/claim", &claim(3)).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(
        names(first),
        ["b-3", "a-1", "b0"],
        "best first, across both queues"
    );
    // The first claim's per-queue scans locked a5 and b7 without taking
    // them: those locks ended with its statement.
    let (_, rest) = c.api.post("/v1/claim", &claim(10)).await;
    assert_eq!(
        names(rest),
        ["a5", "b7"],
        "the rest, and nothing of another queue"
    );
    let (_, none) = c.api.post("/v1/claim", &claim(10)).await;
    assert_eq!(none["leases"], json!([]));
}

#[tokio::test]
async fn idempotency_key_answers_the_original_job() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let body = json!({"queue": "q", "payload": {"n": 1}, "idempotency_key": "order-42"});
    let (s1, first) = c.api.post("/v1/jobs", &body).await;
    let (s2, second) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "q", "payload": {"n": 2}, "idempotency_key": "order-42"}),
        )
        .await;
    assert_eq!((s1, s2), (201, 200));
    assert_eq!(first["id"], second["id"]);
    assert_eq!(second["payload"], json!({"n": 1}));
    // Same key on another queue is another job.
    let (s3, third) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "other", "payload": 3, "idempotency_key": "order-42"}),
        )
        .await;
    assert_eq!(s3, 201);
    assert_ne!(third["id"], first["id"]);
}

#[tokio::test]
async fn batch_enqueue_answers_in_order_in_one_transaction() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs: Vec<Value> = (0..50)
        .map(|i| json!({"queue": "batch", "payload": {"i": i}, "idempotency_key": format!("k{}", i % 40)}))
        .collect();
    let (status, body) = c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await;
    assert_eq!(status, 201, "{body}");
    let answered = body["jobs"].as_array().unwrap();
    assert_eq!(answered.len(), 50);
    for (i, j) in answered.iter().enumerate() {
        assert_eq!(j["payload"]["i"], json!(i % 40), "item {i} answers its key's job");
    }
    assert_eq!(answered[45]["id"], answered[5]["id"]);
    let count: i64 = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    assert_eq!(count, 40);

    // One bad job refuses the whole batch: nothing is written.
    let (status, body) = c
        .api
        .post("/v1/jobs/batch", &json!({"jobs": [{"queue": "batch", "payload": 1}, {"queue": "batch", "payload": 2, "max_attempts": 0}]}))
        .await;
    assert_eq!(status, 422);
    assert!(
        body["error"]["message"].as_str().unwrap().starts_with("jobs[1]"),
        "{body}"
    );
    let count: i64 = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    assert_eq!(count, 40);
}

#[tokio::test]
async fn time_left_hands_out_only_jobs_that_fit() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut long = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("q").unwrap(),
        json!("long"),
    );
    long.timeout_ms = Some(10_000);
    let long = c.api.enqueue_with(long).await;
    let claim = |time_left: u64| json!({"queues": ["q"], "worker_id": "lambda", "max_jobs": 5, "wait_ms": 0, "time_left_ms": time_left});
    let (status, body) = c.api.post("/v1/claim", &claim(3_000)).await;
    assert_eq!(status, 200);
    assert_eq!(body["leases"], json!([]));
    let (_, body) = c.api.post("/v1/claim", &claim(20_000)).await;
    assert_eq!(body["leases"][0]["job_id"], json!(long.id));
    assert_eq!(body["leases"][0]["timeout_ms"], 10_000);
}

#[tokio::test]
async fn a_lease_is_not_renewed_past_the_jobs_timeout() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut req = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("q").unwrap(),
        json!(1),
    );
    req.timeout_ms = Some(200);
    let created = c.api.enqueue_with(req).await;
    let lease = c.api.claim_one("q", "w").await;
    // Until the attempt's timeout has passed on PostgreSQL's clock, the one
    // the heartbeat statement compares with.
    let client = db.client().await;
    let started = std::time::Instant::now();
    while !client
        .query_one(
            "SELECT now() > claimed_at + timeout_ms * interval '1 millisecond' FROM jobs WHERE id = $1",
            &[&created.id.0],
        )
        .await
        .unwrap()
        .get::<_, bool>(0)
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the 200 ms timeout never passed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let status = c.api.heartbeat(&lease).await;
    assert_eq!(
        status,
        serde_json::to_value(HeartbeatStatus::LeaseLost)
            .unwrap()
            .as_str()
            .unwrap()
    );
    let report = crate::reaping::reap_once(&db).await;
    assert_eq!(report.requeued, 1);
    let job = c.api.job(created.id).await;
    assert_eq!(
        job.attempts[0].error.as_deref(),
        Some("attempt exceeded its timeout")
    );
}
