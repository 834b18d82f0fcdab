//! The terminal tallies (done, failed and cancelled per queue, behind
//! `/v1/queues` and `/metrics`) stay equal to the jobs really in those
//! states, whichever way a job ends or comes back: the coordinator's own
//! statements write their deltas, and any other session's updates (an
//! operator's SQL, a coordinator of an older version) ask for a recount,
//! which the next fold makes; never both.

use std::collections::BTreeMap;

use runlease_tests::{Api, TestCoordinator, TestDb};
use serde_json::json;

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
    // older version), in one transaction: into a terminal state, and a
    // terminal job moved to another queue. They ask for a recount, which
    // the next fold makes.
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
