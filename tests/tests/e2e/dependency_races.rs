//! Dependencies under races: two coordinators ending a job's last two
//! dependencies at the same instant queue it once; a dependency that ends
//! under a stale lease settles nothing; the reaper's failures cascade.

use std::time::{Duration, Instant};

use runlease_protocol::JobState;
use runlease_tests::{CoordinatorProcess, TestCoordinator, TestDb};
use serde_json::json;
use uuid::Uuid;

use crate::dependencies::{batch, ids_of};
use crate::expire_leases;
use crate::reaping::reap_once;

/// Waits until `n` backends of database `name` wait on a lock.
async fn until_lock_waiters(db: &TestDb, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = db
            .scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await;
        if waiting >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} of {n} finishes wait on the lock"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn two_coordinators_ending_the_last_two_dependencies_at_once_queue_the_job_once() {
    let db = TestDb::new().await;
    let one = CoordinatorProcess::start(&db, &[]).await;
    let two = CoordinatorProcess::start(&db, &[]).await;
    let rounds = 50;
    let mut waiting = Vec::new();
    for round in 0..rounds {
        let jobs = batch(
            &one.api,
            json!([
                {"queue": "left", "payload": round, "ref": "a"},
                {"queue": "right", "payload": round, "ref": "b"},
                {"queue": "joined", "payload": round, "depends_on": ["a", "b"]},
            ]),
        )
        .await;
        let ids = ids_of(&jobs);
        let left = one.api.claim_one("left", "w1").await;
        let right = two.api.claim_one("right", "w2").await;
        // Hold the waiting job's row: both finishes lock their dependency,
        // take their snapshot, and then wait for it, so that both settle
        // it at the same instant once it is let go.
        let mut holder = db.client().await;
        let tx = holder.transaction().await.unwrap();
        tx.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", &[&ids[2]])
            .await
            .unwrap();
        let (api1, api2) = (one.api.clone(), two.api.clone());
        let first = tokio::spawn(async move { api1.complete(&left, json!("l")).await });
        let second = tokio::spawn(async move { api2.complete(&right, json!("r")).await });
        until_lock_waiters(&db, 2).await;
        tx.commit().await.unwrap();
        for finish in [first, second] {
            let (status, body) = finish.await.unwrap();
            assert_eq!(status, 200, "round {round}: {body}");
        }
        let job = one.api.job(ids[2]).await;
        assert_eq!(job.state, JobState::Queued, "round {round}");
        waiting.push(ids[2]);
    }
    let pending = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE id = ANY($1) AND (state <> 'queued' OR dependencies_pending <> 0)",
            &[&waiting],
        )
        .await;
    assert_eq!(pending, 0);
    // Each was queued by exactly one of the two transactions.
    let sample = "runlease_jobs_unblocked_total{queue=\"joined\"}";
    let counted = one.api.metric(sample).await + two.api.metric(sample).await;
    assert_eq!(counted, f64::from(rounds));
    let claimed = one.api.claim("joined", "w", 1000).await;
    assert_eq!(claimed.len(), rounds as usize);
}

#[tokio::test]
async fn a_dependency_ended_under_a_stale_lease_settles_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs = batch(
        &c.api,
        json!([
            {"queue": "stale", "payload": 0, "ref": "a"},
            {"queue": "after", "payload": 1, "depends_on": ["a"]},
        ]),
    )
    .await;
    let ids = ids_of(&jobs);
    let old = c.api.claim_one("stale", "w1").await;
    expire_leases(&db, &[ids[0]]).await;
    assert_eq!(reap_once(&db).await.requeued, 1);
    let new = c.api.claim_one("stale", "w2").await;
    assert_eq!(new.job_id, old.job_id);

    let (status, body) = c.api.complete(&old, json!("late")).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lease_lost");
    assert_eq!(c.api.job(ids[1]).await.state, JobState::Blocked);
    assert!(c.api.claim("after", "w", 10).await.is_empty());

    assert_eq!(c.api.complete(&new, json!("on time")).await.0, 200);
    let lease = c.api.claim_one("after", "w").await;
    assert_eq!(lease.job_id.0, ids[1]);
    assert_eq!(lease.dependencies[0].result, Some(json!("on time")));
}

#[tokio::test]
async fn a_dependency_the_reaper_fails_for_good_cancels_its_dependents() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs = batch(
        &c.api,
        json!([
            {"queue": "reaped", "payload": 0, "ref": "a", "max_attempts": 1},
            {"queue": "reaped", "payload": 1, "ref": "b", "depends_on": ["a"]},
            {"queue": "reaped", "payload": 2, "depends_on": ["b"]},
        ]),
    )
    .await;
    let ids: Vec<Uuid> = ids_of(&jobs);
    c.api.claim_one("reaped", "w").await;
    expire_leases(&db, &[ids[0]]).await;
    assert_eq!(reap_once(&db).await.failed, 1);
    assert_eq!(c.api.job(ids[0]).await.state, JobState::Failed);
    for (id, dependency, how) in [(ids[1], ids[0], "failed"), (ids[2], ids[1], "was cancelled")] {
        let job = c.api.job(id).await;
        assert_eq!(job.state, JobState::Cancelled);
        assert_eq!(job.error, Some(format!("dependency {dependency} {how}")));
    }
    let (_, q) = c.api.get("/v1/queues/reaped").await;
    assert_eq!(
        (q["counts"]["cancelled"].as_i64(), q["counts"]["failed"].as_i64()),
        (Some(2), Some(1)),
        "{q}"
    );
}
