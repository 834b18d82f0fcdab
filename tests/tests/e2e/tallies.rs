//! The terminal tallies (done, failed and cancelled per queue, behind
//! `/v1/queues` and `/metrics`) stay equal to the jobs really in those
//! states, whichever way a job ends or comes back: the coordinator's own
//! statements write their deltas, and any other session's updates and
//! deletes (an operator's SQL, a coordinator of an older version) ask for
//! a recount, which the prune loop makes after a fold; never both.

use std::collections::BTreeMap;
use std::time::Duration;

use runlease_coordinator::store::prune::{Folded, Recount, Sweep};
use runlease_coordinator::store::sql;
use runlease_protocol::JobState;
use runlease_tests::{Api, TestCoordinator, TestDb};
use serde_json::json;
use uuid::Uuid;

use crate::expire_leases;
use crate::reaping::reap_once;

/// (queue, state) → jobs, for the terminal states: from the tallies, and
/// from the rows themselves.
async fn tallied_and_counted(
    db: &TestDb,
) -> (BTreeMap<(String, String), i64>, BTreeMap<(String, String), i64>) {
    let client = db.client().await;
    let read = |sql: &'static str| {
        let client = &client;
        async move {
            client
                .query(sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|r| ((r.get::<_, String>(0), r.get::<_, String>(1)), r.get::<_, i64>(2)))
                .filter(|(_, n)| *n != 0)
                .collect::<BTreeMap<_, _>>()
        }
    };
    let tallied = read(
        "SELECT queue, tally, sum(n)::bigint FROM job_tallies
         WHERE tally IN ('done', 'failed', 'cancelled') GROUP BY queue, tally",
    )
    .await;
    let counted = read(
        "SELECT queue, state::text, count(*) FROM jobs
         WHERE state IN ('done', 'failed', 'cancelled') GROUP BY queue, state",
    )
    .await;
    (tallied, counted)
}

/// Asserts that nothing asked for a recount of the tallies: no request
/// waits, and the coordinator made none (the coordinator's own statements
/// never ask; only changes made outside them do).
pub(crate) async fn no_recount_asked(api: &Api, db: &TestDb) {
    let requests: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM job_tally_recounts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(requests, 0, "recount requests waiting");
    assert_eq!(
        db.scalar("SELECT count(*) FROM job_attempt_sweeps", &[]).await,
        0,
        "sweep requests waiting"
    );
    assert_eq!(
        api.metric("runlease_tally_recounts_total").await,
        0.0,
        "recounts made"
    );
}

fn key(queue: &str, state: &str) -> (String, String) {
    (queue.to_owned(), state.to_owned())
}

#[tokio::test]
async fn terminal_tallies_follow_every_way_a_job_ends_and_comes_back() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let api = &c.api;
    for i in 0..12 {
        api.enqueue_attempts("t", json!(i), 1).await;
    }
    let leases = api.claim("t", "w", 12).await;
    assert_eq!(leases.len(), 12);
    // Completes (one finish with several items), a fail for good, a
    // retryable fail with budget (max_attempts 1: none left, so failed), a
    // release (queued again, no tally).
    let items: Vec<_> = leases[..4]
        .iter()
        .map(|l| json!({"lease_token": l.lease_token, "action": "complete", "result": 1}))
        .collect();
    let (status, body) = api.post("/v1/finish", &json!({"items": items})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(api.fail(&leases[4], "boom", false, None).await.0, 200);
    assert_eq!(api.fail(&leases[5], "boom", true, None).await.0, 200);
    assert_eq!(api.release(&leases[6], None).await.0, 200);
    // A cancel of a running job, acknowledged by its worker: cancelled.
    assert_eq!(
        api.post(&format!("/v1/jobs/{}/cancel", leases[7].job_id), &json!({}))
            .await
            .0,
        200
    );
    assert_eq!(api.fail(&leases[7], "stopped", true, None).await.0, 200);
    // Two expired leases reaped: no budget left, so failed.
    let expiring = [leases[8].job_id.0, leases[9].job_id.0];
    expire_leases(&db, &expiring).await;
    assert_eq!(reap_once(&db).await.failed, 2);
    // A queued job cancelled at once (the released one).
    assert_eq!(
        api.post(&format!("/v1/jobs/{}/cancel", leases[6].job_id), &json!({}))
            .await
            .0,
        200
    );
    let (tallied, counted) = tallied_and_counted(&db).await;
    assert_eq!(tallied, counted);
    assert_eq!(counted.get(&key("t", "done")), Some(&4));
    assert_eq!(counted.get(&key("t", "failed")), Some(&4));
    assert_eq!(counted.get(&key("t", "cancelled")), Some(&2));

    // Back out of terminal states: one retry, then a bulk retry of the rest
    // of the failed, a bulk delete of the done.
    assert_eq!(
        api.post(&format!("/v1/jobs/{}/retry", leases[4].job_id), &json!({}))
            .await
            .0,
        200
    );
    let (status, body) = api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "retry", "queue": "t", "states": ["failed"]}),
        )
        .await;
    assert_eq!((status, body["changed"].clone()), (200, json!(3)), "{body}");
    let (status, body) = api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "delete", "queue": "t", "states": ["done"]}),
        )
        .await;
    assert_eq!((status, body["changed"].clone()), (200, json!(4)), "{body}");
    let (tallied, counted) = tallied_and_counted(&db).await;
    assert_eq!(tallied, counted);
    assert_eq!(counted.get(&key("t", "failed")), None);

    no_recount_asked(api, &db).await;

    // Another session's updates (an operator's SQL, or a coordinator of an
    // older version), in one transaction: into a terminal state, a terminal
    // job moved to another queue, and a terminal job deleted. They ask for
    // a recount, which the prune loop makes after its next fold.
    let mut other = db.client().await;
    let tx = other.transaction().await.unwrap();
    tx.execute(
        "UPDATE jobs SET state = 'cancelled', finished_at = now(), updated_at = now()
         WHERE queue = 't' AND state = 'queued'",
        &[],
    )
    .await
    .unwrap();
    tx.execute(
        "UPDATE jobs SET queue = 'moved' WHERE id = $1",
        &[&leases[7].job_id.0],
    )
    .await
    .unwrap();
    let deleted = tx
        .execute(
            "DELETE FROM jobs
             WHERE id = (SELECT id FROM jobs WHERE queue = 't' AND state = 'cancelled' ORDER BY id LIMIT 1)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    tx.commit().await.unwrap();
    api.until_metric("runlease_tally_recounts_total", "a recount of the tallies", |n| {
        n >= 1.0
    })
    .await;
    let (tallied, counted) = tallied_and_counted(&db).await;
    assert_eq!(tallied, counted);
    assert_eq!(counted.get(&key("moved", "cancelled")), Some(&1));
    // The figures the API answers are the tallies.
    let (_, queue) = api.get("/v1/queues/t").await;
    assert_eq!(
        queue["counts"]["cancelled"].as_i64(),
        counted.get(&key("t", "cancelled")).copied(),
        "{queue}"
    );
}

/// A recount runs while a coordinator's finish is still open (its job
/// change and its tally delta not yet committed) and while a fold is still
/// open: the count does not see the change, leaves the delta and waits for
/// neither, so once both commit the totals are exact, and the attempt
/// tallies are left alone.
#[tokio::test]
async fn a_recount_beside_an_open_finish_loses_and_doubles_nothing() {
    let db = TestDb::new().await;
    // No coordinator: the test folds and recounts itself, in its order.
    let store = db.store().await;
    db.insert_terminal_jobs("t", JobState::Done, 3, Duration::from_secs(60))
        .await;
    let setup = db.client().await;
    let open = Uuid::now_v7();
    setup
        .execute(
            "INSERT INTO jobs (id, queue, payload, max_attempts) VALUES ($1, 't', '{}', 1)",
            &[&open],
        )
        .await
        .unwrap();
    setup
        .execute(
            "INSERT INTO job_tallies (queue, tally, n) VALUES ('t', 'retries', 5)",
            &[],
        )
        .await
        .unwrap();

    // A coordinator's statement in flight: marked, its delta written, not
    // yet committed.
    let mut finishing = db.client().await;
    let finish = finishing.transaction().await.unwrap();
    finish
        .batch_execute("SET LOCAL runlease.tallies = 'explicit'")
        .await
        .unwrap();
    finish
        .execute(
            "WITH ended AS (
                 UPDATE jobs SET state = 'cancelled', finished_at = now() WHERE id = $1
                 RETURNING queue, state)
             INSERT INTO job_tallies (queue, tally, n)
             SELECT queue, state::text, count(*) FROM ended GROUP BY queue, state",
            &[&open],
        )
        .await
        .unwrap();

    // An UPDATE by hand, committed: it asks for a recount.
    let moved = setup
        .execute(
            "UPDATE jobs SET queue = 'moved'
             WHERE id = (SELECT id FROM jobs WHERE state = 'done' ORDER BY id LIMIT 1)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(moved, 1);
    // A fold in flight (another replica's), holding the deltas it folds.
    let mut folding = db.client().await;
    let fold = folding.transaction().await.unwrap();
    fold.batch_execute(sql::JOB_TALLY_FOLD).await.unwrap();
    assert_eq!(store.recount_tallies().await.unwrap(), Recount::Counted);
    fold.commit().await.unwrap();
    assert_eq!(
        store.recount_tallies().await.unwrap(),
        Recount::NotAsked,
        "the requests were served"
    );
    let (tallied, counted) = tallied_and_counted(&db).await;
    assert_eq!(tallied, counted, "before the finish commits");

    finish.commit().await.unwrap();
    assert!(matches!(store.fold_tallies().await.unwrap(), Folded::Done { .. }));
    let (tallied, counted) = tallied_and_counted(&db).await;
    assert_eq!(tallied, counted, "after the finish commits");
    assert_eq!(counted.get(&key("t", "done")), Some(&2));
    assert_eq!(counted.get(&key("moved", "done")), Some(&1));
    assert_eq!(counted.get(&key("t", "cancelled")), Some(&1));
    let retries: i64 = setup
        .query_one(
            "SELECT sum(n)::bigint FROM job_tallies WHERE queue = 't' AND tally = 'retries'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(retries, 5, "a recount leaves the attempt tallies alone");

    // A coordinator of version 7 deletes in a transaction marked for its
    // updates only, and writes no delta for the delete: it asks too.
    let mut old = db.client().await;
    let tx = old.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL runlease.tallies = 'explicit'")
        .await
        .unwrap();
    let deleted = tx
        .execute("DELETE FROM jobs WHERE queue = 'moved'", &[])
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    tx.commit().await.unwrap();
    let requests: i64 = setup
        .query_one("SELECT count(*) FROM job_tally_recounts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(requests, 1);
    assert_eq!(store.recount_tallies().await.unwrap(), Recount::Counted);
    let (tallied, counted) = tallied_and_counted(&db).await;
    assert_eq!(tallied, counted, "after a delete of the previous version");
    assert_eq!(counted.get(&key("moved", "done")), None);
}

/// The attempt log keeps no foreign key to jobs: the coordinator's prune
/// and bulk delete delete the attempts of the jobs they delete, and a
/// delete made anywhere else (by hand; by a coordinator of version 8,
/// which counted on the key's cascade) asks for a sweep, which deletes the
/// attempts it left and no other, in batches, and only then serves the
/// requests. A coordinator of version 8 serving the recount requests
/// leaves the sweep's requests alone: they have a table of their own.
#[tokio::test]
async fn attempts_left_by_a_delete_made_outside_the_coordinator_are_swept() {
    let db = TestDb::new().await;
    let store = db.store().await;
    let by_hand = db
        .insert_terminal_jobs("s", JobState::Cancelled, 3, Duration::from_secs(60))
        .await;
    let by_v8 = db
        .insert_terminal_jobs("s", JobState::Cancelled, 2, Duration::from_secs(60))
        .await;
    let kept = db
        .insert_terminal_jobs("s", JobState::Cancelled, 4, Duration::from_secs(60))
        .await;
    assert_eq!(
        logged(&db, &by_hand).await,
        3,
        "a cancelled job's attempt is in the log"
    );
    assert_eq!(store.sweep_attempts().await.unwrap(), Sweep::NotAsked);

    let client = db.client().await;
    let deleted = client
        .execute("DELETE FROM jobs WHERE id = ANY($1)", &[&by_hand])
        .await
        .unwrap();
    assert_eq!(deleted, 3);
    // A coordinator of version 8: marked for its tallies, which it writes.
    let mut v8 = db.client().await;
    let tx = v8.transaction().await.unwrap();
    tx.batch_execute(
        "SET LOCAL runlease.tallies = 'explicit'; SET LOCAL runlease.tally_deletes = 'explicit'",
    )
    .await
    .unwrap();
    tx.execute(
        "WITH gone AS (DELETE FROM jobs WHERE id = ANY($1) RETURNING queue, state)
         INSERT INTO job_tallies (queue, tally, n)
         SELECT queue, state::text, -count(*) FROM gone GROUP BY queue, state",
        &[&by_v8],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(logged(&db, &by_hand).await, 3, "no cascade");
    assert_eq!(
        db.scalar("SELECT count(*) FROM job_attempt_sweeps", &[]).await,
        2,
        "each delete asked for a sweep"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM job_tally_recounts", &[]).await,
        1,
        "the delete by hand asked for a recount; the version-8 one wrote its tallies"
    );
    // A version-8 coordinator's recount serves the recount requests only.
    client
        .execute("DELETE FROM job_tally_recounts", &[])
        .await
        .unwrap();

    assert_eq!(
        store.sweep_attempts().await.unwrap(),
        Sweep::Swept { attempts: 5 }
    );
    assert_eq!(logged(&db, &by_hand).await, 0);
    assert_eq!(logged(&db, &by_v8).await, 0);
    assert_eq!(logged(&db, &kept).await, 4, "attempts of jobs still here stay");
    assert_eq!(
        db.scalar("SELECT count(*) FROM job_attempt_sweeps", &[]).await,
        0,
        "the requests were served"
    );
    assert_eq!(store.sweep_attempts().await.unwrap(), Sweep::NotAsked);

    // More orphans than a batch: a TRUNCATE leaves every attempt behind,
    // and the sweep takes them in several transactions.
    db.execute_marked(
        "INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
         SELECT $1, g, 'w', now(), now(), 'released', NULL, 'queued' FROM generate_series(2, 25001) g",
        &[&kept[0]],
    )
    .await;
    client.execute("TRUNCATE jobs", &[]).await.unwrap();
    assert_eq!(
        store.sweep_attempts().await.unwrap(),
        Sweep::Swept { attempts: 25_004 }
    );
    assert_eq!(db.scalar("SELECT count(*) FROM job_attempt_log", &[]).await, 0);

    // The coordinator's bulk delete takes the attempts with the jobs and
    // asks for nothing.
    let more = db
        .insert_terminal_jobs("s", JobState::Cancelled, 4, Duration::from_secs(60))
        .await;
    let c = TestCoordinator::start(&db).await;
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/bulk",
            &json!({"action": "delete", "queue": "s", "states": ["cancelled"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["changed"], 4, "{body}");
    assert_eq!(logged(&db, &more).await, 0);
    assert_eq!(
        db.scalar("SELECT count(*) FROM job_attempt_sweeps", &[]).await,
        0,
        "the bulk delete asked for no sweep"
    );
}

/// Rows of `job_attempt_log` for `ids`.
async fn logged(db: &TestDb, ids: &[Uuid]) -> i64 {
    db.scalar(
        "SELECT count(*) FROM job_attempt_log WHERE job_id = ANY($1)",
        &[&ids.to_vec()],
    )
    .await
}

/// The attempt tallies (`lease_expiries`, `retries`) count every attempt
/// that ends in a lease expiry, and every failed or expired attempt after
/// which the job was queued again, exactly once: the finish and the reaper
/// count the attempts they write (schema version 10), and the attempt
/// log's trigger counts only attempts written outside a transaction so
/// marked (by hand, or by a coordinator of an earlier version).
#[tokio::test]
async fn attempt_tallies_count_each_retry_and_lease_expiry_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let api = &c.api;
    for i in 0..6 {
        api.enqueue_attempts("a", json!(i), 3).await;
    }
    let leases = api.claim("a", "w", 6).await;
    assert_eq!(leases.len(), 6);
    // A retryable fail with budget left (a retry), a fail for good, a
    // release (no charge, no retry), a fail under a cancel request
    // (cancelled), two expired leases with budget left (two expiries, two
    // retries).
    assert_eq!(api.fail(&leases[0], "again", true, None).await.0, 200);
    assert_eq!(api.fail(&leases[1], "boom", false, None).await.0, 200);
    assert_eq!(api.release(&leases[2], None).await.0, 200);
    assert_eq!(
        api.post(&format!("/v1/jobs/{}/cancel", leases[3].job_id), &json!({}))
            .await
            .0,
        200
    );
    assert_eq!(api.fail(&leases[3], "stopped", true, None).await.0, 200);
    expire_leases(&db, &[leases[4].job_id.0, leases[5].job_id.0]).await;
    assert_eq!(reap_once(&db).await.requeued, 2);

    assert_eq!(attempt_tallies(&db, "a").await, (3, 2));
    assert_eq!(attempt_counts(&db, "a").await, (3, 2));
    no_recount_asked(api, &db).await;

    // Attempts written outside a marked transaction are counted by the
    // trigger: by a coordinator of version 9 (marked for the terminal
    // tallies only) and by hand.
    let client = db.client().await;
    let mut old = db.client().await;
    let tx = old.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL runlease.tallies = 'explicit'")
        .await
        .unwrap();
    tx.execute(
        "INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
         VALUES ($1, 90, 'w', now(), now(), 'failed', 'boom', 'queued')",
        &[&leases[1].job_id.0],
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    client
        .execute(
            "INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
             VALUES ($1, 91, 'w', now(), now(), 'lease_expired', 'lapsed', 'queued')",
            &[&leases[1].job_id.0],
        )
        .await
        .unwrap();
    assert_eq!(attempt_tallies(&db, "a").await, (5, 3));
    assert_eq!(attempt_counts(&db, "a").await, (5, 3));
}

/// The `retries` and `lease_expiries` tallies of `queue`.
async fn attempt_tallies(db: &TestDb, queue: &str) -> (i64, i64) {
    let sum = |tally: &'static str| async move {
        db.scalar(
            "SELECT coalesce(sum(n), 0)::bigint FROM job_tallies WHERE queue = $1 AND tally = $2",
            &[&queue, &tally],
        )
        .await
    };
    (sum("retries").await, sum("lease_expiries").await)
}

/// The same two figures counted from the chronology, as the tallies
/// define them.
async fn attempt_counts(db: &TestDb, queue: &str) -> (i64, i64) {
    let retries = db
        .scalar(
            "SELECT count(*) FROM job_attempts a JOIN jobs j ON j.id = a.job_id
             WHERE j.queue = $1 AND a.outcome IN ('failed', 'lease_expired')
               AND a.state_after = 'queued'",
            &[&queue],
        )
        .await;
    let expiries = db
        .scalar(
            "SELECT count(*) FROM job_attempts a JOIN jobs j ON j.id = a.job_id
             WHERE j.queue = $1 AND a.outcome = 'lease_expired'",
            &[&queue],
        )
        .await;
    (retries, expiries)
}
