//! Dead-letter follow-ups: a job that fails for good on a queue with a
//! dead-letter queue leaves exactly one job there, enqueued by the
//! statement that failed it, whichever way it failed (a worker's fail, the
//! reaper, both at once on two coordinators); a retried failure, a cancel
//! or a completion leaves none; an admin retry that fails again leaves a
//! second one.

use std::time::Duration;

use runlease_protocol::{JobId, JobState};
use runlease_tests::process::CoordinatorProcess;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

use crate::expire_leases;

/// Sets `queue`'s dead-letter queue to `dead_letter`.
async fn route(api: &runlease_tests::api::Api, queue: &str, dead_letter: &str) {
    let (status, body) = api
        .patch(
            &format!("/v1/queues/{queue}"),
            &json!({"dead_letter_queue": dead_letter}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["settings"]["dead_letter_queue"], dead_letter);
}

/// The follow-ups of job `id` (the payloads of the jobs naming it).
async fn follow_ups(db: &TestDb, id: JobId) -> Vec<(String, Value, Option<String>)> {
    db.client()
        .await
        .query(
            "SELECT queue, payload, idempotency_key FROM jobs WHERE payload ->> 'job_id' = $1::text ORDER BY id",
            &[&id.0.to_string()],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test]
async fn a_job_failing_for_good_leaves_one_follow_up_with_what_happened() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    route(&c.api, "orders", "orders-dead").await;
    // A worker parked on the dead-letter queue is woken by the follow-up.
    let api = c.api.clone();
    let parked = tokio::spawn(async move { api.claim_wait("orders-dead", "dl-worker", 1, 20_000).await });
    c.api.until_claims_parked(1).await;

    let job = c.api.enqueue_attempts("orders", json!({"order": 7}), 2).await;
    let first = c.api.claim_one("orders", "w").await;
    assert_eq!(
        c.api
            .fail(&first, "timeout talking to bank", true, Some(0))
            .await
            .0,
        200
    );
    assert!(
        follow_ups(&db, job.id).await.is_empty(),
        "a retried failure leaves none"
    );
    let second = c.api.claim_one("orders", "w").await;
    let (status, body) = c.api.fail(&second, "card declined", true, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "failed");
    // A repeat of the same fail changes nothing.
    assert_eq!(c.api.fail(&second, "card declined", true, None).await.0, 200);

    let found = follow_ups(&db, job.id).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let (queue, payload, key) = &found[0];
    assert_eq!(queue, "orders-dead");
    assert_eq!(
        payload,
        &json!({"job_id": job.id, "queue": "orders", "payload": {"order": 7},
                "error": "card declined", "attempts": 2})
    );
    assert_eq!(
        key.as_deref(),
        Some(format!("dead-letter:{}:{}", job.id, second.run_lease.0).as_str())
    );

    let leases = tokio::time::timeout(Duration::from_secs(20), parked)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leases.len(), 1, "the parked claim got the follow-up");
    assert_eq!(leases[0].payload["job_id"], json!(job.id));
    c.api
        .until_metric(
            "runlease_dead_letters_total{queue=\"orders\"}",
            "one dead letter counted",
            |n| n == 1.0,
        )
        .await;
}

#[tokio::test]
async fn cancelled_done_and_unrouted_jobs_leave_no_follow_up() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    route(&c.api, "q", "q-dead").await;
    let cancelled = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(
        c.api
            .post(&format!("/v1/jobs/{}/cancel", cancelled.id), &json!({}))
            .await
            .0,
        200
    );
    assert_eq!(c.api.fail(&lease, "stopped", false, None).await.0, 200);
    assert_eq!(c.api.job(cancelled.id).await.state, JobState::Cancelled);
    let done = c.api.enqueue("q", json!(2)).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    let unrouted = c.api.enqueue("other", json!(3)).await;
    let lease = c.api.claim_one("other", "w").await;
    assert_eq!(c.api.fail(&lease, "no", false, None).await.0, 200);
    for id in [cancelled.id, done.id, unrouted.id] {
        assert!(follow_ups(&db, id).await.is_empty());
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobs WHERE queue = 'q-dead'", &[])
            .await,
        0
    );
}

#[tokio::test]
async fn the_reaper_failing_the_last_attempt_leaves_one_follow_up() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    route(&c.api, "r", "r-dead").await;
    let job = c.api.enqueue_attempts("r", json!({"n": 1}), 1).await;
    let lease = c.api.claim_one("r", "w").await;
    expire_leases(&db, &[job.id.0]).await;
    let report = crate::reaping::reap_once(&db).await;
    assert_eq!(report.failed, 1, "{report:?}");
    let found = follow_ups(&db, job.id).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let (queue, payload, _) = &found[0];
    assert_eq!(queue, "r-dead");
    assert_eq!(payload["attempts"], 1);
    assert_eq!(payload["payload"], json!({"n": 1}));
    assert!(
        payload["error"].as_str().unwrap().contains("lease expired"),
        "{payload}"
    );
    // The worker's late fail of the reaped lease is refused and adds nothing.
    assert_eq!(c.api.fail(&lease, "late", false, None).await.0, 409);
    assert_eq!(follow_ups(&db, job.id).await.len(), 1);
}

#[tokio::test]
async fn an_admin_retry_that_fails_again_leaves_a_second_follow_up() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    route(&c.api, "a", "a-dead").await;
    let job = c.api.enqueue_attempts("a", json!(1), 1).await;
    let lease = c.api.claim_one("a", "w").await;
    assert_eq!(c.api.fail(&lease, "first", true, None).await.0, 200);
    assert_eq!(
        c.api
            .post(&format!("/v1/jobs/{}/retry", job.id), &json!({}))
            .await
            .0,
        200
    );
    let lease = c.api.claim_one("a", "w").await;
    assert_eq!(c.api.fail(&lease, "second", true, None).await.0, 200);
    let found = follow_ups(&db, job.id).await;
    let errors: Vec<&Value> = found.iter().map(|(_, p, _)| &p["error"]).collect();
    assert_eq!(
        errors,
        [&json!("first"), &json!("second")],
        "one per failure for good"
    );
}

/// Rounds of the race below.
const ROUNDS: usize = 8;

#[tokio::test]
async fn two_coordinators_ending_the_same_job_at_once_leave_one_follow_up() {
    let db = TestDb::new().await;
    // Two coordinator processes: `reaping` reaps every 10 ms; `failing`
    // hands out 300 ms leases and takes a late fail of each, sent around
    // the instant the other's reaper takes the lease back.
    let reaping = CoordinatorProcess::start(&db, &[("RUNLEASE_REAPER_INTERVAL_MS", "10".to_owned())]).await;
    let failing = CoordinatorProcess::start(
        &db,
        &[
            ("RUNLEASE_LEASE_TTL_MS", "300".to_owned()),
            ("RUNLEASE_HEARTBEAT_INTERVAL_MS", "100".to_owned()),
            ("RUNLEASE_REAPER_INTERVAL_MS", "3600000".to_owned()),
        ],
    )
    .await;
    route(&failing.api, "race", "race-dead").await;
    let mut fails_won = 0;
    for round in 0..ROUNDS {
        let job = failing
            .api
            .enqueue_attempts("race", json!({"round": round}), 1)
            .await;
        let lease = failing.api.claim_one("race", "w").await;
        // From just before the expiry to just after it.
        let wait = 270 + 10 * round as u64;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let (status, body) = failing.api.fail(&lease, "late", false, None).await;
        assert!(status == 200 || status == 409, "{status}: {body}");
        if status == 200 {
            fails_won += 1;
        }
        let ended = runlease_tests::api::terminal(&failing.api, job.id).await;
        assert_eq!(ended.state, JobState::Failed, "round {round}");
        let found = follow_ups(&db, job.id).await;
        assert_eq!(found.len(), 1, "round {round}: {found:?}");
        let error = found[0].1["error"].as_str().unwrap().to_owned();
        assert_eq!(
            status == 200,
            error == "late",
            "round {round}: the winner wrote the follow-up ({error})"
        );
    }
    // Both coordinators also fail the same lease at once: one applies it,
    // the other answers it as a repeat or refuses it.
    let job = failing.api.enqueue_attempts("race", json!("both"), 1).await;
    let lease = failing.api.claim_one("race", "w").await;
    let (a, b) = tokio::join!(
        failing.api.fail(&lease, "late", false, None),
        reaping.api.fail(&lease, "late", false, None)
    );
    assert!(a.0 == 200 || b.0 == 200, "{a:?} {b:?}");
    assert_eq!(follow_ups(&db, job.id).await.len(), 1);
    let total: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE queue = 'race-dead'", &[])
        .await;
    assert_eq!(total, ROUNDS as i64 + 1, "one follow-up per job, no more");
    eprintln!("late fails that won the race: {fails_won} of {ROUNDS}");
}
