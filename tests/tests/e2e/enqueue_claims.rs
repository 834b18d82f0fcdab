//! Claimers parked for a queue are served in the transaction of the
//! single-job enqueue that makes their jobs: one commit for both, no claim
//! statement of their own, no wake-up of the claim loop. Claims the
//! enqueue's statement cannot serve as they are (a time limit, several
//! queues, a job not due yet) are woken as before. A claimer that joins a
//! resting group looks by itself, leaving those parked before it on their
//! shelf.

use std::collections::HashSet;
use std::time::Instant;

use runlease_protocol::JobState;
use runlease_tests::{SLOW_RECHECK_MS, TestCoordinator, TestDb, WOKEN_WITHIN};
use serde_json::json;

const ENQUEUE_CLAIMS: &str = "runlease_batch_size_count{kind=\"enqueue_claim\"}";
const CLAIM_STATEMENTS: &str = "runlease_batch_size_count{kind=\"claim\"}";

/// A coordinator whose parked claims look again only when woken.
async fn woken_only(db: &TestDb) -> TestCoordinator {
    TestCoordinator::start_with(db, |cfg| {
        cfg.leases.claim_recheck = std::time::Duration::from_millis(SLOW_RECHECK_MS)
    })
    .await
}

#[tokio::test]
async fn a_parked_claimer_is_served_by_the_enqueue_that_makes_its_job() {
    let db = TestDb::new().await;
    let c = woken_only(&db).await;
    let mut parked = Vec::new();
    for w in 0..3 {
        let api = c.api.clone();
        parked.push(tokio::spawn(async move {
            let worker = format!("w{w}");
            let leases = api.claim_wait("inline", &worker, 2, 30_000).await;
            (worker, leases)
        }));
    }
    c.api.until_claims_parked(3).await;
    let statements_before = c.api.metric(CLAIM_STATEMENTS).await;

    let enqueued_at = Instant::now();
    let job = c.api.enqueue("inline", json!({"n": 1})).await;
    // The enqueue is answered once its transaction committed, lease and all.
    let row = db
        .client()
        .await
        .query_one(
            "SELECT state::text, run_lease, owned_by FROM jobs WHERE id = $1",
            &[&job.id.0],
        )
        .await
        .unwrap();
    assert_eq!(
        row.get::<_, String>(0),
        "running",
        "claimed in the enqueue's transaction"
    );
    assert_eq!(row.get::<_, i64>(1), 1);
    let owner: String = row.get(2);

    // One claimer is served; the others stay parked.
    c.api
        .until_metric("runlease_claim_waiters", "the other claimers parked", |v| {
            v == 2.0
        })
        .await;
    while !parked.iter().any(|p| p.is_finished()) {
        assert!(enqueued_at.elapsed() < WOKEN_WITHIN, "no claimer answered");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (done, waiting): (Vec<_>, Vec<_>) = parked.into_iter().partition(|p| p.is_finished());
    assert_eq!(done.len(), 1, "one claimer served");
    let (worker, served) = done.into_iter().next().unwrap().await.unwrap();
    assert!(enqueued_at.elapsed() < WOKEN_WITHIN);
    assert_eq!(served.len(), 1);
    assert_eq!(served[0].job_id, job.id);
    assert_eq!(owner, worker);
    assert_eq!(c.api.metric(ENQUEUE_CLAIMS).await, 1.0);
    // No claim statement of the claim loop ran for it: the enqueue's own
    // transaction wrote the job and its lease. Claims of another queue,
    // one through each claim loop (they take turns), each cost one
    // statement, run after any wake-up a loop had pending.
    for i in 0..8 {
        assert!(c.api.claim("elsewhere", &format!("probe{i}"), 1).await.is_empty());
    }
    assert_eq!(c.api.metric(CLAIM_STATEMENTS).await, statements_before + 8.0);

    // The lease works as any other.
    let (status, body) = c.api.complete(&served[0], json!("ok")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(c.api.job(job.id).await.state, JobState::Done);
    for p in waiting {
        p.abort();
    }
}

#[tokio::test]
async fn concurrent_enqueues_hand_each_job_to_one_parked_claimer() {
    let db = TestDb::new().await;
    let c = woken_only(&db).await;
    let mut parked = Vec::new();
    for w in 0..30 {
        let api = c.api.clone();
        parked.push(tokio::spawn(async move {
            api.claim_wait("crowd", &format!("w{w}"), 3, 30_000).await
        }));
    }
    c.api.until_claims_parked(30).await;
    let enqueues: Vec<_> = (0..60)
        .map(|i| {
            let api = c.api.clone();
            tokio::spawn(async move { api.enqueue("crowd", json!(i)).await.id })
        })
        .collect();
    let mut made = HashSet::new();
    for e in enqueues {
        made.insert(e.await.unwrap());
    }
    // Sixty jobs for thirty claimers of up to three: either every claimer
    // is served (by an enqueue's transaction, or by the claim loop on a
    // wake-up) or every job is handed out, and no job goes to two of them.
    let deadline = Instant::now() + WOKEN_WITHIN;
    let mut seen = HashSet::new();
    let mut waiting = parked;
    loop {
        let (done, rest): (Vec<_>, Vec<_>) = waiting.into_iter().partition(|p| p.is_finished());
        waiting = rest;
        for p in done {
            let leases = p.await.unwrap();
            assert!(!leases.is_empty(), "a claimer answered without a job");
            for l in leases {
                assert!(made.contains(&l.job_id));
                assert!(seen.insert(l.job_id), "job {} handed out twice", l.job_id);
            }
        }
        if waiting.is_empty() || seen.len() == made.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} claimers wait beside {} jobs not handed out",
            waiting.len(),
            made.len() - seen.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(c.api.metric(ENQUEUE_CLAIMS).await >= 1.0);
    let running: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM jobs WHERE state = 'running'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(running as usize, seen.len(), "every job claimed was handed out");
    for p in waiting {
        p.abort();
    }
}

#[tokio::test]
async fn a_claimer_the_enqueue_cannot_serve_parks_again_and_is_served_later() {
    let db = TestDb::new().await;
    let c = woken_only(&db).await;
    let (status, body) = c.api.patch("/v1/queues/held", &json!({"paused": true})).await;
    assert_eq!(status, 200, "{body}");
    let api = c.api.clone();
    let claimer = tokio::spawn(async move { api.claim_wait("held", "w", 1, 30_000).await });
    c.api.until_claims_parked(1).await;

    // Taken by the enqueue, found nothing on a paused queue, parked again.
    let job = c.api.enqueue("held", json!({})).await;
    assert_eq!(c.api.metric(ENQUEUE_CLAIMS).await, 1.0);
    c.api.until_claims_parked(1).await;
    assert_eq!(c.api.job(job.id).await.state, JobState::Queued);
    assert!(!claimer.is_finished());

    // The resume's wake-up serves it.
    let (status, body) = c.api.patch("/v1/queues/held", &json!({"paused": false})).await;
    assert_eq!(status, 200, "{body}");
    let leases = tokio::time::timeout(WOKEN_WITHIN, claimer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].job_id, job.id);
}

#[tokio::test]
async fn claims_with_a_time_limit_or_jobs_not_due_are_left_to_the_claim_loop() {
    let db = TestDb::new().await;
    let c = woken_only(&db).await;
    // A claimer with a time limit: woken by the enqueue, served by the loop.
    let api = c.api.clone();
    let limited = tokio::spawn(async move {
        let body = json!({"queues": ["timed"], "worker_id": "w", "max_jobs": 1,
                          "wait_ms": 30_000, "time_left_ms": 600_000});
        api.post("/v1/claim", &body).await
    });
    c.api.until_claims_parked(1).await;
    let job = c.api.enqueue("timed", json!({})).await;
    let (status, body) = tokio::time::timeout(WOKEN_WITHIN, limited)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"][0]["job_id"], json!(job.id));
    assert_eq!(c.api.metric(ENQUEUE_CLAIMS).await, 0.0);

    // A job due later takes nobody from the shelf.
    let api = c.api.clone();
    let waiting = tokio::spawn(async move { api.claim_wait("later", "w2", 1, 30_000).await });
    c.api.until_claims_parked(1).await;
    let (status, body) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "later", "payload": {}, "delay_ms": 60_000}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(c.api.metric(ENQUEUE_CLAIMS).await, 0.0);
    assert_eq!(c.api.metric("runlease_claim_waiters").await, 1.0);
    assert!(!waiting.is_finished());
    waiting.abort();
}

/// One claimer ("first") parked on `queue`, then `n` jobs made due behind
/// the coordinator's back: no wake-up tells the parked claimer (its timer
/// would, a minute later).
async fn parked_then_due(
    c: &TestCoordinator,
    db: &TestDb,
    queue: &'static str,
    n: usize,
) -> (
    tokio::task::JoinHandle<Vec<runlease_protocol::worker::Lease>>,
    Vec<uuid::Uuid>,
) {
    let api = c.api.clone();
    let first = tokio::spawn(async move { api.claim_wait(queue, "first", 1, 30_000).await });
    c.api.until_claims_parked(1).await;
    let mut ids = Vec::new();
    for _ in 0..n {
        let job = json!({"queue": queue, "payload": {}, "delay_ms": 3_600_000});
        let (status, body) = c.api.post("/v1/jobs", &job).await;
        assert_eq!(status, 201, "{body}");
        ids.push(uuid::Uuid::parse_str(body["id"].as_str().unwrap()).unwrap());
    }
    db.client()
        .await
        .execute("UPDATE jobs SET run_at = now() WHERE id = ANY($1)", &[&ids])
        .await
        .unwrap();
    (first, ids)
}

#[tokio::test]
async fn a_newcomer_looks_by_itself_while_the_claimers_parked_before_it_wait() {
    let db = TestDb::new().await;
    let c = woken_only(&db).await;
    let (first, ids) = parked_then_due(&c, &db, "lost", 1).await;

    // The newcomer's own look finds it at once; the claimer parked before
    // it is not taken off its shelf for that look.
    let started = Instant::now();
    let leases = c.api.claim_wait("lost", "second", 1, 30_000).await;
    assert!(started.elapsed() < WOKEN_WITHIN);
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0].job_id.0, ids[0]);
    assert_eq!(c.api.metric("runlease_claim_waiters").await, 1.0);
    assert!(!first.is_finished());
    first.abort();
}

#[tokio::test]
async fn a_newcomer_that_finds_jobs_sends_the_parked_claimers_to_look_too() {
    let db = TestDb::new().await;
    let c = woken_only(&db).await;
    let (first, ids) = parked_then_due(&c, &db, "due", 2).await;
    // The newcomer takes one; the claimer parked before it takes the
    // other at once, not at its timer.
    let started = Instant::now();
    let second = c.api.claim_wait("due", "second", 1, 30_000).await;
    assert_eq!(second.len(), 1);
    let first = tokio::time::timeout(WOKEN_WITHIN, first).await.unwrap().unwrap();
    assert!(started.elapsed() < WOKEN_WITHIN);
    assert_eq!(first.len(), 1);
    let got: HashSet<_> = [first[0].job_id.0, second[0].job_id.0].into();
    assert_eq!(got, ids.into_iter().collect());
}
