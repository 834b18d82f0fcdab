//! Flow control, enforced across coordinators: `max_running` and
//! `max_running_per_key` are never exceeded, not for an instant, with two
//! coordinator processes and 50 claimers; a key at its limit does not block
//! the others; a lowered limit starts nothing until the count is under it;
//! a rate limit holds starts to `burst + per_s × elapsed` and reaches it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use runlease_protocol::QueueName;
use runlease_protocol::producer::EnqueueJobRequest;
use runlease_tests::{Api, CoordinatorProcess, TestCoordinator, TestDb};
use serde_json::{Value, json};

async fn enqueue_keyed(api: &Api, queue: &str, jobs: &[(Option<&str>, i64)]) {
    for chunk in jobs.chunks(500) {
        let batch: Vec<Value> = chunk
            .iter()
            .map(|(key, priority)| {
                let mut req = EnqueueJobRequest::new(QueueName::new(queue).unwrap(), json!(priority));
                req.concurrency_key = key.map(str::to_owned);
                req.priority = Some(*priority as i32);
                serde_json::to_value(req).unwrap()
            })
            .collect();
        let (status, body) = api.post("/v1/jobs/batch", &json!({"jobs": batch})).await;
        assert_eq!(status, 201, "{body}");
    }
}

/// 50 claimers spread over the coordinators, each holding what it claims
/// for a random few milliseconds, until every job of `queue` is done, while
/// a sampler reads the running jobs (per key) from PostgreSQL every few
/// milliseconds. Answers the most seen at once: in all, and per key.
async fn run_and_sample(db: &TestDb, apis: &[Api], queue: &str, total: i64) -> (i64, i64) {
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let client = db.client().await;
        let done = done.clone();
        let queue = queue.to_owned();
        tokio::spawn(async move {
            let (mut most, mut most_per_key) = (0i64, 0i64);
            let mut samples = 0;
            while !done.load(Ordering::SeqCst) {
                let rows = client
                    .query(
                        "SELECT coalesce(concurrency_key, ''), count(*) FROM jobs
                         WHERE queue = $1 AND state = 'running' GROUP BY 1",
                        &[&queue],
                    )
                    .await
                    .unwrap();
                let per_key: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
                most = most.max(per_key.values().sum());
                most_per_key = most_per_key.max(
                    per_key
                        .iter()
                        .filter(|(k, _)| !k.is_empty())
                        .map(|(_, n)| *n)
                        .max()
                        .unwrap_or(0),
                );
                samples += 1;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert!(samples > 50, "the sampler looked often ({samples} samples)");
            (most, most_per_key)
        })
    };
    let mut claimers = tokio::task::JoinSet::new();
    for w in 0..50 {
        let api = apis[w % apis.len()].clone();
        let queue = queue.to_owned();
        claimers.spawn(async move {
            let mut idle = 0;
            while idle < 3 {
                let leases = api
                    .claim_wait(&queue, &format!("w{w}"), 1 + (w as u32 % 3), 300)
                    .await;
                if leases.is_empty() {
                    idle += 1;
                    continue;
                }
                idle = 0;
                tokio::time::sleep(Duration::from_millis(rand_ms(w, leases.len()))).await;
                for lease in &leases {
                    assert_eq!(api.complete(lease, json!("ok")).await.0, 200);
                }
            }
        });
    }
    while let Some(c) = claimers.join_next().await {
        c.unwrap();
    }
    done.store(true, Ordering::SeqCst);
    let seen = sampler.await.unwrap();
    let finished = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE queue = $1 AND state = 'done'",
            &[&queue],
        )
        .await;
    assert_eq!(finished, total, "every job ran");
    seen
}

/// A pseudo-random hold of 1 to 20 ms.
fn rand_ms(w: usize, n: usize) -> u64 {
    1 + ((w * 7919 + n * 104_729 + Instant::now().elapsed().subsec_nanos() as usize) % 20) as u64
}

async fn two_coordinators(db: &TestDb) -> (CoordinatorProcess, CoordinatorProcess) {
    let env = [("RUNLEASE_CLAIM_RECHECK_MS", "200".to_owned())];
    (
        CoordinatorProcess::start(db, &env).await,
        CoordinatorProcess::start(db, &env).await,
    )
}

#[tokio::test]
async fn max_running_is_never_exceeded_across_two_coordinators() {
    let db = TestDb::new().await;
    let (a, b) = two_coordinators(&db).await;
    let (status, body) = a
        .api
        .patch("/v1/queues/limited", &json!({"max_running": 5}))
        .await;
    assert_eq!(status, 200, "{body}");
    let jobs: Vec<(Option<&str>, i64)> = (0..300).map(|i| (None, i % 5)).collect();
    enqueue_keyed(&a.api, "limited", &jobs).await;
    let (most, _) = run_and_sample(&db, &[a.api.clone(), b.api.clone()], "limited", 300).await;
    assert!(most <= 5, "at most 5 running at once, saw {most}");
    assert_eq!(most, 5, "the limit was reached, not just respected");
    assert!(
        a.api
            .metric(r#"runlease_claims_held_back_total{queue="limited",limit="max_running"}"#)
            .await
            + b.api
                .metric(r#"runlease_claims_held_back_total{queue="limited",limit="max_running"}"#)
                .await
            > 0.0
    );
}

#[tokio::test]
async fn max_running_per_key_is_never_exceeded_for_any_key() {
    let db = TestDb::new().await;
    let (a, b) = two_coordinators(&db).await;
    let (status, _) = a
        .api
        .patch("/v1/queues/tenants", &json!({"max_running_per_key": 2}))
        .await;
    assert_eq!(status, 200);
    let keys = ["acme", "globex", "initech", "umbrella"];
    let jobs: Vec<(Option<&str>, i64)> = (0..240).map(|i| (Some(keys[i % 4]), (i % 3) as i64)).collect();
    enqueue_keyed(&a.api, "tenants", &jobs).await;
    let (_, most_per_key) = run_and_sample(&db, &[a.api.clone(), b.api.clone()], "tenants", 240).await;
    assert!(most_per_key <= 2, "at most 2 running per key, saw {most_per_key}");
    assert_eq!(most_per_key, 2);
}

#[tokio::test]
async fn a_key_at_its_limit_does_not_block_the_other_keys() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    c.api
        .patch("/v1/queues/q", &json!({"max_running_per_key": 1}))
        .await;
    // 50 jobs of "big", ahead of everything else; then one of "small" and one without a key.
    let mut jobs: Vec<(Option<&str>, i64)> = (0..50).map(|_| (Some("big"), 0)).collect();
    jobs.push((Some("small"), 5));
    jobs.push((None, 9));
    enqueue_keyed(&c.api, "q", &jobs).await;
    let first = c.api.claim("q", "w", 10).await;
    // One of "big" (its limit), then "small", then the unkeyed one, in priority order.
    let payloads: Vec<Value> = first.iter().map(|l| l.payload.clone()).collect();
    assert_eq!(payloads, vec![json!(0), json!(5), json!(9)]);
    assert!(
        c.api.claim("q", "w", 10).await.is_empty(),
        "every key is at its limit"
    );
    let (_, q) = c.api.get("/v1/queues/q").await;
    assert_eq!(
        q["held_by_limits"],
        json!(49),
        "big's other jobs wait behind its limit: {q}"
    );
    assert_eq!(c.api.complete(&first[0], json!("ok")).await.0, 200);
    let next = c.api.claim("q", "w", 10).await;
    assert_eq!(next.len(), 1, "the finished lease freed one slot of big");
    let (_, q) = c.api.get("/v1/queues/q").await;
    assert_eq!(q["settings"]["max_running_per_key"], json!(1));
    // The keyed claims change no tally.
    crate::tallies::no_recount_asked(&c.api, &db).await;
}

#[tokio::test]
async fn a_lowered_limit_starts_nothing_until_the_count_is_under_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    c.api.patch("/v1/queues/q", &json!({"max_running": 10})).await;
    enqueue_keyed(&c.api, "q", &(0..30).map(|_| (None, 0)).collect::<Vec<_>>()).await;
    let held = c.api.claim("q", "w", 20).await;
    assert_eq!(held.len(), 10);
    c.api.patch("/v1/queues/q", &json!({"max_running": 3})).await;
    for lease in &held[..5] {
        assert_eq!(c.api.complete(lease, json!("ok")).await.0, 200);
    }
    assert!(
        c.api.claim("q", "w", 5).await.is_empty(),
        "5 still run, above the new limit of 3"
    );
    let (_, q) = c.api.get("/v1/queues/q").await;
    assert_eq!(
        q["held_by_limits"],
        json!(20),
        "every due job waits behind max_running: {q}"
    );
    for lease in &held[5..8] {
        assert_eq!(c.api.complete(lease, json!("ok")).await.0, 200);
    }
    assert_eq!(
        c.api.claim("q", "w", 5).await.len(),
        1,
        "2 run: one more may start"
    );
    // Cleared, the queue goes back to the shared claim statement.
    c.api.patch("/v1/queues/q", &json!({"max_running": null})).await;
    assert_eq!(c.api.claim_wait("q", "w", 50, 5_000).await.len(), 19);
}

#[tokio::test]
async fn a_rate_limit_holds_starts_to_burst_plus_rate_and_reaches_it() {
    let db = TestDb::new().await;
    let (a, b) = two_coordinators(&db).await;
    a.api
        .patch(
            "/v1/queues/rated",
            &json!({"rate_limit": {"per_s": 20.0, "burst": 5}}),
        )
        .await;
    enqueue_keyed(&a.api, "rated", &(0..400).map(|_| (None, 0)).collect::<Vec<_>>()).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut claimers = tokio::task::JoinSet::new();
    for w in 0..20 {
        let api = if w % 2 == 0 { a.api.clone() } else { b.api.clone() };
        let stop = stop.clone();
        claimers.spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                for lease in api.claim_wait("rated", &format!("w{w}"), 2, 2_000).await {
                    assert_eq!(api.complete(&lease, json!("ok")).await.0, 200);
                }
            }
        });
    }
    let client = db.client().await;
    let first: Option<chrono::DateTime<chrono::Utc>> = loop {
        let row = client
            .query_one("SELECT min(claimed_at) FROM jobs WHERE queue = 'rated'", &[])
            .await
            .unwrap();
        if let Some(t) = row.get::<_, Option<chrono::DateTime<chrono::Utc>>>(0) {
            break Some(t);
        }
        tokio::task::yield_now().await;
    };
    let first = first.unwrap();
    // Ten seconds of starts, measured on PostgreSQL's clock.
    loop {
        let now: chrono::DateTime<chrono::Utc> = client.query_one("SELECT now()", &[]).await.unwrap().get(0);
        if (now - first).num_milliseconds() >= 10_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(c) = claimers.join_next().await {
        c.unwrap();
    }
    // The first start of all (the first one seen above may have been a
    // moment later than another in the same instant).
    let first: chrono::DateTime<chrono::Utc> = client
        .query_one("SELECT min(claimed_at) FROM jobs WHERE queue = 'rated'", &[])
        .await
        .unwrap()
        .get(0);
    let starts: Vec<f64> = client
        .query(
            "SELECT extract(epoch FROM claimed_at - $1)::float8 FROM jobs
             WHERE queue = 'rated' AND claimed_at IS NOT NULL ORDER BY claimed_at",
            &[&first],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    for (i, t) in starts.iter().enumerate() {
        let allowed = 5.0 + 20.0 * t;
        assert!(
            (i + 1) as f64 <= allowed + 1e-6,
            "start {} at {t:.3} s is past 5 + 20 × t = {allowed:.2}",
            i + 1
        );
    }
    let in_ten = starts.iter().filter(|t| **t <= 10.0).count() as f64;
    assert!(
        in_ten >= 0.9 * (5.0 + 20.0 * 10.0),
        "with work waiting the limit is reached: {in_ten} starts in 10 s"
    );
    eprintln!("rate limit 20/s burst 5: {in_ten} starts in the first 10 s (the limit allows 205)");
}

#[tokio::test]
async fn bad_limits_and_keys_are_refused_with_what_is_wrong() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for (body, needle) in [
        (json!({"max_running": 0}), "max_running"),
        (json!({"max_running_per_key": -1}), "max_running_per_key"),
        (json!({"rate_limit": {"per_s": 0.0, "burst": 1}}), "per_s"),
        (json!({"rate_limit": {"per_s": 1.0, "burst": 0}}), "burst"),
        (json!({"rate_limit": {"per_s": 1e-300, "burst": 1}}), "per_s"),
    ] {
        let (status, answer) = c.api.patch("/v1/queues/q", &body).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert!(
            answer["error"]["message"].as_str().unwrap().contains(needle),
            "{answer}"
        );
    }
    for key in ["k".repeat(256), "nul\u{0}byte".to_owned(), String::new()] {
        let (status, answer) = c
            .api
            .post(
                "/v1/jobs",
                &json!({"queue": "q", "payload": 1, "concurrency_key": key}),
            )
            .await;
        assert_eq!(status, 422, "{answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("concurrency_key")
        );
    }
    assert_eq!(db.scalar("SELECT count(*) FROM jobs", &[]).await, 0);
}

#[tokio::test]
async fn the_slowest_rate_holds_its_queue_and_leaves_the_others_alone() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let (status, body) = c
        .api
        .patch(
            "/v1/queues/tiny",
            &json!({"rate_limit": {"per_s": 0.001, "burst": 1}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    enqueue_keyed(&c.api, "tiny", &[(None, 0), (None, 0), (None, 0)]).await;
    enqueue_keyed(&c.api, "other", &[(None, 0)]).await;
    assert_eq!(c.api.claim("tiny", "w", 2).await.len(), 1, "the burst");
    assert!(
        c.api.claim_wait("tiny", "w", 2, 300).await.is_empty(),
        "the next token is 1,000 s away"
    );
    assert_eq!(
        c.api.claim("other", "w", 2).await.len(),
        1,
        "other queues are served as before"
    );
}
