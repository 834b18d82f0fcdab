//! Claim floors: a claim's scan starts at its queue's floor instead of at
//! the queue's first index entry, so an old snapshot that keeps vacuum from
//! removing the entries of claimed jobs does not make every claim walk
//! them; and no job is passed by: one enqueued ahead of the queue's order,
//! one another transaction held while the floor was read, one written with
//! no wake-up reaching the coordinator.

use std::time::Duration;

use chrono::Utc;
use runlease_protocol::worker::Lease;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

fn leases(body: &Value) -> Vec<Lease> {
    serde_json::from_value(body["leases"].clone()).unwrap()
}

/// Enqueues `n` jobs on `queue` due `ago_s` seconds ago (a backlog), in
/// batches; answers their ids in claim order.
async fn backlog(c: &TestCoordinator, queue: &str, n: usize, ago_s: i64) -> Vec<String> {
    let run_at = (Utc::now() - chrono::TimeDelta::seconds(ago_s)).to_rfc3339();
    let mut ids = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let jobs: Vec<Value> = chunk
            .iter()
            .map(|i| json!({"queue": queue, "payload": i, "run_at": run_at}))
            .collect();
        let (status, body) = c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await;
        assert_eq!(status, 201, "{body}");
        ids.extend(
            body["jobs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_str().unwrap().to_owned()),
        );
    }
    ids.sort();
    ids
}

/// Completes `held` and claims up to `max_jobs` of `queue` in one request.
async fn cycle(c: &TestCoordinator, queue: &str, held: &[Lease], max_jobs: u32) -> Vec<Lease> {
    let items: Vec<Value> = held
        .iter()
        .map(|l| json!({"lease_token": l.lease_token, "action": "complete", "result": null}))
        .collect();
    let claim = json!({"queues": [queue], "worker_id": "w", "max_jobs": max_jobs, "wait_ms": 0});
    let (status, body) = c
        .api
        .post("/v1/finish", &json!({"items": items, "claim": claim}))
        .await;
    assert_eq!(status, 200, "{body}");
    for item in body["items"].as_array().unwrap() {
        assert_eq!(item["status"], "ok", "{body}");
    }
    leases(&body)
}

#[tokio::test]
async fn claims_under_an_old_snapshot_do_not_walk_the_jobs_claimed_since() {
    const JOBS: usize = 2000;
    const PER_CLAIM: u32 = 10;
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let ids = backlog(&c, "pinned", JOBS, 60).await;

    // A snapshot taken before any claim, held through the drain: no entry
    // of a job claimed meanwhile can be removed from the claim index.
    let pin = db.client().await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        .await
        .unwrap();
    pin.query_one("SELECT count(*) FROM jobs", &[]).await.unwrap();
    let admin = db.client().await;
    admin
        .batch_execute("SELECT pg_stat_reset_single_table_counters('jobs_claim_idx'::regclass)")
        .await
        .unwrap();
    drop(admin);

    let mut claimed = Vec::new();
    let mut held = cycle(&c, "pinned", &[], PER_CLAIM).await;
    let mut claims = 1;
    while !held.is_empty() {
        claimed.extend(held.iter().map(|l| l.job_id.to_string()));
        held = cycle(&c, "pinned", &held, PER_CLAIM).await;
        claims += 1;
    }
    claimed.sort();
    assert_eq!(claimed, ids, "every job claimed once, none passed by");
    c.stop().await.unwrap();

    // The coordinator's connections report what they read as they close.
    let until = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let others = db
            .scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await;
        // The pin's connection stays.
        if others <= 1 {
            break;
        }
        assert!(std::time::Instant::now() < until, "{others} connections left");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let read = db
        .scalar(
            "SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelname = 'jobs_claim_idx'",
            &[],
        )
        .await;
    // From the queue's first entry, the n-th claim would walk the entries
    // of the (n - 1) * PER_CLAIM jobs claimed before it.
    let from_first: i64 = (0..claims).map(|n| n * i64::from(PER_CLAIM)).sum();
    assert!(
        read * 10 < from_first,
        "the claims of {JOBS} jobs ({claims} claims) read {read} entries of the claim index; from each queue's first entry they would have read at least {from_first}"
    );
    pin.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_job_enqueued_ahead_of_the_claimed_ones_is_claimed_next() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let ids = backlog(&c, "ahead", 50, 600).await;
    // The floor moves past the first twenty.
    let mut held = cycle(&c, "ahead", &[], 10).await;
    held = cycle(&c, "ahead", &held, 10).await;
    held = cycle(&c, "ahead", &held, 1).await;
    assert_eq!(held[0].job_id.to_string(), ids[20]);

    // Due before the backlog: sorts below the floor.
    let earlier = (Utc::now() - chrono::TimeDelta::seconds(1200)).to_rfc3339();
    let (status, early) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "ahead", "payload": "early", "run_at": earlier}),
        )
        .await;
    assert_eq!(status, 201, "{early}");
    held = cycle(&c, "ahead", &held, 1).await;
    assert_eq!(held[0].job_id.to_string(), early["id"].as_str().unwrap());

    // A smaller priority sorts below every job of the backlog.
    let (status, urgent) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "ahead", "payload": "urgent", "priority": -1}),
        )
        .await;
    assert_eq!(status, 201, "{urgent}");
    held = cycle(&c, "ahead", &held, 1).await;
    assert_eq!(held[0].job_id.to_string(), urgent["id"].as_str().unwrap());

    // A job released goes back to the queue, still first in order: the claim riding
    // the release takes it again.
    let claim = json!({"queues": ["ahead"], "worker_id": "w", "max_jobs": 1, "wait_ms": 0});
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({"items": [{"lease_token": held[0].lease_token, "action": "release"}], "claim": claim}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let again = leases(&body);
    assert_eq!(again[0].job_id.to_string(), urgent["id"].as_str().unwrap());
    // And so does a claim of its own, once released again.
    let (status, body) = c.api.release(&again[0], None).await;
    assert_eq!(status, 200, "{body}");
    let again = cycle(&c, "ahead", &[], 1).await;
    assert_eq!(again[0].job_id.to_string(), urgent["id"].as_str().unwrap());
    // Then the backlog goes on where it was.
    let next = cycle(&c, "ahead", &again, 1).await;
    assert_eq!(next[0].job_id.to_string(), ids[21]);
}

#[tokio::test]
async fn a_job_another_transaction_held_while_the_floor_was_read_is_claimed_after() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let ids = backlog(&c, "held", 10, 600).await;

    // Another transaction holds the first job (as a dependent's enqueue
    // holds its dependency): the claim skips it.
    let other = db.client().await;
    other.batch_execute("BEGIN").await.unwrap();
    other
        .execute(
            "SELECT 1 FROM jobs WHERE id = $1::text::uuid FOR KEY SHARE",
            &[&ids[0]],
        )
        .await
        .unwrap();
    let held = cycle(&c, "held", &[], 5).await;
    let got: Vec<String> = held.iter().map(|l| l.job_id.to_string()).collect();
    assert_eq!(got, ids[1..6].to_vec(), "the held job is skipped");
    let more = cycle(&c, "held", &held, 2).await;
    assert_eq!(more[0].job_id.to_string(), ids[6]);
    other.batch_execute("COMMIT").await.unwrap();

    // The floor stayed at the held job.
    let next = cycle(&c, "held", &more, 1).await;
    assert_eq!(next[0].job_id.to_string(), ids[0]);
}

#[tokio::test]
async fn a_job_written_without_a_wake_up_is_found_by_the_floor_check() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.leases.claim_recheck = Duration::from_millis(50);
    })
    .await;
    let ids = backlog(&c, "quiet", 30, 600).await;
    let mut held = cycle(&c, "quiet", &[], 10).await;
    held = cycle(&c, "quiet", &held, 10).await;
    assert_eq!(held[9].job_id.to_string(), ids[19]);

    // Written as another coordinator would, its wake-up lost: due before
    // the backlog, so below the floor.
    let client = db.client().await;
    let id: uuid::Uuid = client
        .query_one(
            "INSERT INTO jobs (id, queue, payload, max_attempts, run_at)
             VALUES (gen_random_uuid(), 'quiet', '\"unannounced\"', 3, now() - interval '1 hour')
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    c.api
        .until_metric(
            "runlease_claim_floor_misses_total",
            "the floor check lowered the floor",
            |v| v >= 1.0,
        )
        .await;
    let next = cycle(&c, "quiet", &held, 1).await;
    assert_eq!(next[0].job_id.0, id);
}

#[tokio::test]
async fn a_job_enqueued_ahead_through_another_coordinator_is_claimed_next_here() {
    let db = TestDb::new().await;
    // No floor check within the test: only the wake-up through Redis can
    // bring the floor down.
    let here = TestCoordinator::start_with(&db, |config| {
        config.leases.claim_recheck = Duration::from_secs(60);
    })
    .await;
    let there = TestCoordinator::start(&db).await;
    let ids = backlog(&here, "shared", 40, 600).await;
    let mut held = cycle(&here, "shared", &[], 10).await;
    held = cycle(&here, "shared", &held, 10).await;
    assert_eq!(held[9].job_id.to_string(), ids[19]);

    let (status, urgent) = there
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "shared", "payload": "urgent", "priority": -1}),
        )
        .await;
    assert_eq!(status, 201, "{urgent}");
    // Its wake-up reaches this coordinator within milliseconds; until then
    // a claim may still take the backlog's next job.
    let mut passed = 0;
    loop {
        held = cycle(&here, "shared", &held, 1).await;
        if held[0].job_id.to_string() == urgent["id"].as_str().unwrap() {
            break;
        }
        passed += 1;
        assert!(
            passed < 10,
            "the urgent job was not claimed within {passed} claims"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes a job due now on `queue` straight into the table, with no
/// wake-up reaching any coordinator (as one whose publish was lost would
/// leave it); answers its id.
async fn unannounced(db: &TestDb, queue: &str) -> uuid::Uuid {
    db.client()
        .await
        .query_one(
            "INSERT INTO jobs (id, queue, payload, max_attempts)
             VALUES (gen_random_uuid(), $1, '\"unannounced\"', 3)
             RETURNING id",
            &[&queue],
        )
        .await
        .unwrap()
        .get(0)
}

/// A coordinator that re-checks parked claims only once a minute (none
/// within a test), and knows `queue` empty: a claim looked and found
/// nothing.
async fn marked_empty(db: &TestDb, queue: &str) -> TestCoordinator {
    let c = TestCoordinator::start_with(db, |config| {
        config.leases.claim_recheck = Duration::from_secs(60);
    })
    .await;
    assert!(c.api.claim(queue, "w", 1).await.is_empty());
    c
}

/// Claims parked without a statement so far.
async fn unlooked(c: &TestCoordinator) -> f64 {
    c.api.metric("runlease_claims_parked_unlooked_total").await
}

#[tokio::test]
async fn a_claim_of_a_queue_known_empty_parks_without_a_statement_and_is_woken() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let parked_unlooked = |n: f64| {
        let api = c.api.clone();
        async move {
            api.until_metric(
                "runlease_claims_parked_unlooked_total",
                "claims parked unlooked",
                |v| v >= n,
            )
            .await;
        }
    };
    // A look that finds nothing marks the queue empty.
    assert!(c.api.claim("idle", "w", 1).await.is_empty());
    assert_eq!(unlooked(&c).await, 0.0, "a claim that may not wait looks");

    let wait = || {
        let api = c.api.clone();
        tokio::spawn(async move { api.claim_wait("idle", "w", 1, 20_000).await })
    };
    let first = wait();
    parked_unlooked(1.0).await;
    // The enqueue's wake-up serves it, as it would have after a look (here
    // the enqueue claims it in its own transaction).
    let job = c.api.enqueue("idle", json!("first")).await;
    let got = first.await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].job_id, job.id);

    // That enqueue's claim took every job it made: the queue is still
    // known empty.
    let second = wait();
    parked_unlooked(2.0).await;
    // Two jobs at once (a batch, announced by a wake-up): the mark goes.
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/batch",
            &json!({"jobs": [{"queue": "idle", "payload": 1}, {"queue": "idle", "payload": 2}]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(second.await.unwrap().len(), 1);
    // The next claim looks, and finds the other job at once.
    let third = tokio::time::timeout(Duration::from_secs(5), wait())
        .await
        .expect("answered at once")
        .unwrap();
    assert_eq!(third.len(), 1);
    assert_eq!(unlooked(&c).await, 2.0);
}

#[tokio::test]
async fn a_claim_that_may_not_wait_reads_a_queue_known_empty() {
    let db = TestDb::new().await;
    let c = marked_empty(&db, "quiet").await;
    // Written with no wake-up reaching the coordinator (as by another
    // coordinator whose publish was lost): the queue is still marked.
    let id = unannounced(&db, "quiet").await;
    let got = c.api.claim("quiet", "w", 1).await;
    assert_eq!(got.len(), 1, "a claim with wait_ms 0 reads the table");
    assert_eq!(got[0].job_id.0, id);
    assert_eq!(unlooked(&c).await, 0.0);
}

#[tokio::test]
async fn a_job_enqueued_through_another_coordinator_wakes_a_claim_parked_unlooked() {
    let db = TestDb::new().await;
    let here = marked_empty(&db, "shared").await;
    let there = TestCoordinator::start(&db).await;
    let waiting = {
        let api = here.api.clone();
        tokio::spawn(async move { api.claim_wait("shared", "w", 1, 20_000).await })
    };
    here.api.until_claims_parked(1).await;
    assert_eq!(unlooked(&here).await, 1.0);
    // Only the wake-up through Redis can reach it within the re-check's
    // minute.
    let job = there.api.enqueue("shared", json!("from there")).await;
    let got = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("woken within seconds")
        .unwrap();
    assert_eq!(got[0].job_id, job.id);
}

#[tokio::test]
async fn a_claim_parked_without_a_look_looks_before_its_wait_runs_out() {
    let db = TestDb::new().await;
    // No re-check within the test: only the claim's own deadline can make
    // it look.
    let c = marked_empty(&db, "lost").await;
    let waiting = {
        let api = c.api.clone();
        tokio::spawn(async move { api.claim_wait("lost", "w", 1, 1_500).await })
    };
    c.api
        .until_metric("runlease_claims_parked_unlooked_total", "parked unlooked", |v| {
            v >= 1.0
        })
        .await;
    // Its wake-up lost: only a look finds it.
    let id = unannounced(&db, "lost").await;
    let got = waiting.await.unwrap();
    assert_eq!(got.len(), 1, "the claim looked at the end of its wait");
    assert_eq!(got[0].job_id.0, id);
}
