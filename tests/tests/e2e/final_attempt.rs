//! The attempt that ends a job is read from the job row until the job is
//! retried, and the chronology reads the same either way: one entry per
//! ended lease, with the same fields, before and after an admin retry writes
//! it out.

use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};
use uuid::Uuid;

/// Rows of job_attempt_log for a job.
async fn logged(db: &TestDb, id: Uuid) -> i64 {
    db.scalar("SELECT count(*) FROM job_attempt_log WHERE job_id = $1", &[&id])
        .await
}

/// The job's final_outcome column, as text.
async fn final_outcome(db: &TestDb, id: Uuid) -> Option<String> {
    db.client()
        .await
        .query_one("SELECT final_outcome::text FROM jobs WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// The chronology as the API answers it.
async fn chronology(c: &TestCoordinator, id: Uuid) -> Vec<Value> {
    let (status, job) = c.api.get(&format!("/v1/jobs/{id}")).await;
    assert_eq!(status, 200, "{job}");
    job["attempts"].as_array().unwrap().clone()
}

/// The chronology as the `job_attempts` view holds it.
async fn view(db: &TestDb, id: Uuid) -> String {
    db.client()
        .await
        .query_one(
            "SELECT coalesce(json_agg(a ORDER BY run_lease), '[]')::text FROM job_attempts a WHERE job_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_completed_job_keeps_its_final_attempt_on_its_row_and_answers_it_in_the_chronology() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("final", json!({"n": 1})).await;
    // A first attempt released (a row), the second completed (on the job row).
    let first = c.api.claim_one("final", "w-1").await;
    assert_eq!(c.api.release(&first, None).await.0, 200);
    let second = c.api.claim_one("final", "w-2").await;
    let (status, body) = c.api.complete(&second, json!({"ok": true})).await;
    assert_eq!(status, 200, "{body}");

    let id = job.id.0;
    assert_eq!(
        logged(&db, id).await,
        1,
        "only the released attempt is a row of its own"
    );
    assert_eq!(final_outcome(&db, id).await.as_deref(), Some("completed"));
    let attempts = chronology(&c, id).await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(attempts[0]["outcome"], "released");
    assert_eq!(attempts[0]["worker_id"], "w-1");
    assert_eq!(attempts[1]["outcome"], "completed");
    assert_eq!(attempts[1]["worker_id"], "w-2");
    assert_eq!(attempts[1]["run_lease"], second.run_lease.0);
    assert!(attempts[1]["error"].is_null());
    assert!(attempts[1]["finished_at"].is_string());

    // A repeated complete of the same lease is still recognised as a
    // repeat (200), from the outcome on the row.
    let (status, body) = c.api.complete(&second, json!({"ok": true})).await;
    assert_eq!(status, 200, "a repeat of the final complete: {body}");
    // The first lease, which ended in a release, is stale: 409.
    let (status, body) = c.api.complete(&first, json!({"ok": true})).await;
    assert_eq!(status, 409, "{body}");
}

#[tokio::test]
async fn an_admin_retry_writes_the_final_attempt_out_and_the_chronology_reads_the_same() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue_attempts("final", json!({"n": 1}), 2).await;
    let id = job.id.0;
    // Attempt 1 fails and is retried (a row); attempt 2 fails for good (on
    // the job row).
    let first = c.api.claim_one("final", "w-1").await;
    assert_eq!(c.api.fail(&first, "first error", true, Some(0)).await.0, 200);
    let second = c.api.claim_one("final", "w-2").await;
    let (status, body) = c.api.fail(&second, "second error", true, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "failed", "{body}");
    assert_eq!(logged(&db, id).await, 1);
    assert_eq!(final_outcome(&db, id).await.as_deref(), Some("failed"));

    let before_api = chronology(&c, id).await;
    let before_view = view(&db, id).await;
    assert_eq!(before_api.len(), 2, "{before_api:?}");
    assert_eq!(before_api[1]["outcome"], "failed");
    assert_eq!(before_api[1]["error"], "second error");

    let (status, body) = c.api.post(&format!("/v1/jobs/{id}/retry"), &json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "queued", "{body}");
    assert_eq!(logged(&db, id).await, 2, "the retry wrote the final attempt out");
    assert_eq!(final_outcome(&db, id).await, None);
    assert_eq!(
        chronology(&c, id).await,
        before_api,
        "the API's chronology is unchanged"
    );
    assert_eq!(
        view(&db, id).await,
        before_view,
        "the view's chronology is unchanged"
    );

    // The next attempt completes: three entries, the last on the row.
    let third = c.api.claim_one("final", "w-3").await;
    assert_eq!(third.run_lease.0, 3);
    assert_eq!(c.api.complete(&third, json!(3)).await.0, 200);
    let after = chronology(&c, id).await;
    assert_eq!(after.len(), 3, "{after:?}");
    assert_eq!(&after[..2], &before_api[..]);
    assert_eq!(after[2]["outcome"], "completed");
    assert_eq!(logged(&db, id).await, 2);
}

#[tokio::test]
async fn a_cancelled_or_reaped_final_attempt_is_a_row_of_its_own() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // Cancel requested while running, then the worker fails: cancelled.
    let job = c.api.enqueue("final", json!({"n": 1})).await;
    let lease = c.api.claim_one("final", "w-1").await;
    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/cancel", job.id), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = c.api.fail(&lease, "stopped", false, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "cancelled", "{body}");
    assert_eq!(logged(&db, job.id.0).await, 1);
    assert_eq!(final_outcome(&db, job.id.0).await, None);

    // Reaped with no budget left: failed, recorded as lease_expired.
    let job = c.api.enqueue_attempts("final", json!({"n": 2}), 1).await;
    let _lease = c.api.claim_one("final", "w-2").await;
    crate::expire_leases(&db, &[job.id.0]).await;
    assert_eq!(db.store().await.reap(100).await.unwrap().len(), 1);
    assert_eq!(logged(&db, job.id.0).await, 1);
    assert_eq!(final_outcome(&db, job.id.0).await, None);
    let attempts = chronology(&c, job.id.0).await;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0]["outcome"], "lease_expired");
}

#[tokio::test]
async fn the_database_refuses_a_final_outcome_on_a_job_that_is_not_ended_by_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("final", json!({"n": 1})).await;
    let err = db
        .client()
        .await
        .execute(
            "UPDATE jobs SET final_outcome = 'completed' WHERE id = $1",
            &[&job.id.0],
        )
        .await
        .unwrap_err();
    let constraint = err.as_db_error().and_then(|e| e.constraint());
    assert_eq!(constraint, Some("jobs_final_outcome_terminal"), "{err:?}");
}

#[tokio::test]
async fn a_repeated_fail_for_good_is_a_repeat_and_another_outcome_of_that_lease_is_stale() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue_attempts("final", json!({"n": 1}), 1).await;
    let lease = c.api.claim_one("final", "w-1").await;
    let (status, body) = c.api.fail(&lease, "broken", false, None).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("failed")), "{body}");
    assert_eq!(final_outcome(&db, job.id.0).await.as_deref(), Some("failed"));
    // The same fail again: the outcome on the row says it was applied.
    let (status, body) = c.api.fail(&lease, "broken", false, None).await;
    assert_eq!(status, 200, "a repeat of the final fail: {body}");
    // A complete under the same lease is another outcome: stale.
    let (status, body) = c.api.complete(&lease, json!(1)).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lease_lost", "{body}");
    let attempts = chronology(&c, job.id.0).await;
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(attempts[0]["outcome"], "failed");
    assert_eq!(attempts[0]["error"], "broken");
    assert_eq!(logged(&db, job.id.0).await, 0);
}

#[tokio::test]
async fn an_attempt_appended_to_the_view_as_the_previous_version_did_lands_in_the_log() {
    // A coordinator of schema version 5, still running during a rolling
    // upgrade, ends attempts with `INSERT INTO job_attempts`.
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("final", json!({"n": 1})).await;
    let lease = c.api.claim_one("final", "w-old").await;
    let client = db.client().await;
    let n = client
        .execute(
            "WITH ended AS (
                 UPDATE jobs SET state = 'done', result = '1', finished_at = now(),
                                 lease_expires_at = NULL, updated_at = now()
                 WHERE id = $1 AND state = 'running' AND run_lease = $2
                 RETURNING id, run_lease, owned_by, claimed_at, state)
             INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
             SELECT id, run_lease, owned_by, claimed_at, now(), 'completed', NULL, state FROM ended",
            &[&job.id.0, &lease.run_lease.0],
        )
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(logged(&db, job.id.0).await, 1);
    assert_eq!(final_outcome(&db, job.id.0).await, None);
    let attempts = chronology(&c, job.id.0).await;
    assert_eq!(attempts.len(), 1, "one entry, not two: {attempts:?}");
    assert_eq!(attempts[0]["outcome"], "completed");
    assert_eq!(attempts[0]["worker_id"], "w-old");
    // The repeat of that complete through this version is still a repeat.
    let (status, body) = c.api.complete(&lease, json!(1)).await;
    assert_eq!(status, 200, "{body}");
}
