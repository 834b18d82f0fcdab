//! Batching: concurrent requests share statements, yet each is answered with
//! its own outcome, only after its batch committed.

use std::time::{Duration, Instant};

use runlease_protocol::{JobState, RunLease};
use runlease_tests::{SLOW_RECHECK_MS, TestCoordinator, TestDb, WOKEN_WITHIN};
use serde_json::json;

/// A gathering window wide enough that concurrent requests share a batch.
fn gather(cfg: &mut runlease_coordinator::config::Config) {
    cfg.batching.max_delay = std::time::Duration::from_millis(300);
}

fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_current_and_a_stale_finish_of_one_job_in_one_batch_only_the_current_applies() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, gather).await;
    let job = c.api.enqueue("q", json!(1)).await;
    let stale = c.api.claim_one("q", "w1").await;
    assert_eq!(c.api.release(&stale, None).await.0, 200);
    let current = c.api.claim_one("q", "w2").await;
    assert_eq!(current.run_lease, RunLease(2));

    let (a, b) = tokio::join!(
        c.api.complete(&stale, json!("stale result")),
        c.api.complete(&current, json!("current result")),
    );
    assert_eq!(a.0, 409, "{}", a.1);
    assert_eq!(a.1["error"]["code"], "lease_lost");
    assert_eq!(b.0, 200, "{}", b.1);
    let done = c.api.job(job.id).await;
    assert_eq!(done.state, JobState::Done);
    assert_eq!(done.result, Some(json!("current result")));
    assert_eq!(crate::attempts_with(&db, job.id.0, "completed").await, 1);

    // They were written together: one finish batch of two.
    let (_, metrics) = c.api.get_text("/metrics").await;
    assert!(
        metrics.contains("runlease_batch_size_count{kind=\"finish\"} 2")
            || metrics.contains("runlease_batch_size_sum{kind=\"finish\"} 3.0"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_batch_that_hits_a_database_error_fails_every_request_and_applies_none() {
    let db = TestDb::new().await;
    // A trigger that fails the statement when one job's result is "boom".
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.result = '\"boom\"'::jsonb THEN RAISE EXCEPTION 'boom refused'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_boom BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_boom();",
        )
        .await
        .unwrap();
    let c = TestCoordinator::start_with(&db, gather).await;
    for i in 0..5 {
        c.api.enqueue("q", json!(i)).await;
    }
    let leases = c.api.claim("q", "w", 5).await;
    assert_eq!(leases.len(), 5);
    let results = futures_like_join(&c, &leases).await;
    for (status, body) in &results {
        assert_eq!(
            *status, 500,
            "every request of the failed batch gets an error: {body}"
        );
        assert_eq!(body["error"]["code"], "internal");
    }
    let running: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE state = 'running'", &[])
        .await;
    assert_eq!(running, 5, "none applied");
    let attempts: i64 = db.scalar("SELECT count(*) FROM job_attempts", &[]).await;
    assert_eq!(attempts, 0);
    // The same leases complete once the poison is gone.
    for lease in &leases[1..] {
        assert_eq!(c.api.complete(lease, json!("fine")).await.0, 200);
    }
}

/// Completes every lease at once; the first with the poisoned result.
async fn futures_like_join(
    c: &TestCoordinator,
    leases: &[runlease_protocol::worker::Lease],
) -> Vec<(u16, serde_json::Value)> {
    let mut handles = Vec::new();
    for (i, lease) in leases.iter().enumerate() {
        let api = c.api.clone();
        let lease = lease.clone();
        let result = if i == 0 { json!("boom") } else { json!("fine") };
        handles.push(tokio::spawn(async move { api.complete(&lease, result).await }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn shutdown_flushes_a_half_gathered_batch() {
    let db = TestDb::new().await;
    // A gathering window longer than the test: only shutdown can end it.
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.batching.max_delay = std::time::Duration::from_millis(60_000)
    })
    .await;
    let job = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w").await;
    let api = c.api.clone();
    let pending = tokio::spawn(async move { api.complete(&lease, json!("flushed")).await });
    // The complete is gathered, waiting for company, when shutdown begins.
    c.api
        .until_metric(
            "runlease_batch_gathering{kind=\"finish\"}",
            "the complete is gathered",
            |v| v == 1.0,
        )
        .await;
    assert_eq!(
        c.api.job(job.id).await.state,
        JobState::Running,
        "not written yet"
    );
    let stopping = Instant::now();
    c.stop().await.unwrap();
    let (status, body) = pending.await.unwrap();
    assert_eq!(status, 200, "answered after its batch committed: {body}");
    assert!(
        stopping.elapsed() < Duration::from_secs(10),
        "shutdown flushed the batch instead of waiting out its window ({:?})",
        stopping.elapsed()
    );
    let row = db
        .client()
        .await
        .query_one("SELECT state::text, result FROM jobs WHERE id = $1", &[&job.id.0])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "done");
    assert_eq!(row.get::<_, serde_json::Value>(1), json!("flushed"));
}

#[tokio::test]
async fn parked_claimers_of_a_queue_are_served_by_shared_claim_statements() {
    let db = TestDb::new().await;
    // Only the enqueue's wake-up can serve them in time.
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.leases.claim_recheck = std::time::Duration::from_millis(SLOW_RECHECK_MS)
    })
    .await;
    let mut parked = Vec::new();
    for w in 0..40 {
        let api = c.api.clone();
        parked.push(tokio::spawn(async move {
            let leases = api.claim_wait("shared", &format!("w{w}"), 2, 20_000).await;
            (leases, Instant::now())
        }));
    }
    c.api.until_claims_parked(40).await;
    let (_, before) = c.api.get_text("/metrics").await;
    assert_eq!(metric(&before, "runlease_claim_waiters"), 40.0, "{before}");
    let statements_before = metric(&before, "runlease_batch_size_count{kind=\"claim\"}");
    let jobs: Vec<_> = (0..80)
        .map(|i| json!({"queue": "shared", "payload": i}))
        .collect();
    let enqueued_at = Instant::now();
    assert_eq!(c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await.0, 201);

    let mut seen = std::collections::HashSet::new();
    for p in parked {
        let (leases, answered_at) = p.await.unwrap();
        assert_eq!(leases.len(), 2, "each parked claimer gets what it asked for");
        let woken = answered_at - enqueued_at;
        assert!(
            woken < WOKEN_WITHIN,
            "served on the enqueue's wake-up ({woken:?})"
        );
        for l in leases {
            assert!(seen.insert(l.job_id), "a job handed out twice");
        }
    }
    assert_eq!(seen.len(), 80);
    let (_, after) = c.api.get_text("/metrics").await;
    let statements = metric(&after, "runlease_batch_size_count{kind=\"claim\"}") - statements_before;
    assert!(
        statements < 40.0,
        "40 parked claimers served by {statements} claim statements"
    );
}

#[tokio::test]
async fn the_per_request_mode_gives_the_same_answers() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.batching.enabled = false;
        cfg.leases.claim_recheck = std::time::Duration::from_millis(SLOW_RECHECK_MS);
    })
    .await;
    let job = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(c.api.heartbeat(&lease).await, "renewed");
    assert_eq!(c.api.complete(&lease, json!("r")).await.0, 200);
    assert_eq!(c.api.complete(&lease, json!("r")).await.0, 200);
    assert_eq!(c.api.job(job.id).await.state, JobState::Done);
    // A parked claim of its own wakes on the enqueue, not on its timer.
    let api = c.api.clone();
    let parked = tokio::spawn(async move {
        let leases = api.claim_wait("q", "w", 1, 20_000).await;
        (leases, Instant::now())
    });
    c.api.until_claims_parked(1).await;
    let enqueued_at = Instant::now();
    let second = c.api.enqueue("q", json!(2)).await;
    let (leases, answered_at) = parked.await.unwrap();
    assert_eq!(leases.first().map(|l| l.job_id), Some(second.id));
    let woken = answered_at - enqueued_at;
    assert!(woken < WOKEN_WITHIN, "woken by the enqueue ({woken:?})");
}

#[tokio::test]
async fn two_outcomes_of_one_lease_in_one_batch_apply_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, gather).await;
    let job = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w").await;
    let (done, failed) = tokio::join!(
        c.api.complete(&lease, json!("r")),
        c.api.fail(&lease, "no", false, None),
    );
    let mut statuses = [done.0, failed.0];
    statuses.sort_unstable();
    assert_eq!(
        statuses,
        [200, 409],
        "one outcome applies, the other is stale: {done:?} {failed:?}"
    );
    let attempts: i64 = db
        .scalar(
            "SELECT count(*) FROM job_attempts WHERE job_id = $1",
            &[&job.id.0],
        )
        .await;
    assert_eq!(attempts, 1);
}

#[tokio::test]
async fn a_value_postgres_refuses_fails_only_its_own_request() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, gather).await;
    let a = c.api.enqueue("q", json!(1)).await;
    let b = c.api.enqueue("q", json!(2)).await;
    let leases = c.api.claim("q", "w", 2).await;
    let (bad, good) = tokio::join!(
        c.api.complete(&leases[0], json!({"text": "nul \u{0000}"})),
        c.api.complete(&leases[1], json!("fine")),
    );
    assert_eq!(bad.0, 422, "{}", bad.1);
    assert_eq!(good.0, 200, "{}", good.1);
    let states = [c.api.job(a.id).await.state, c.api.job(b.id).await.state];
    assert!(
        states.contains(&JobState::Running) && states.contains(&JobState::Done),
        "{states:?}"
    );
}

#[tokio::test]
async fn concurrent_single_enqueues_share_a_transaction_and_a_repeated_key_answers_the_original() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;

    // 40 single enqueues at once: 30 distinct jobs, and 10 with one shared
    // idempotency key (one is created, the other nine answer it).
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..40 {
        let api = c.api.clone();
        sends.spawn(async move {
            let body = if i < 30 {
                json!({"queue": "q", "payload": i})
            } else {
                json!({"queue": "q", "payload": i, "idempotency_key": "same"})
            };
            (i, api.post("/v1/jobs", &body).await)
        });
    }
    let mut answers = sends.join_all().await;
    answers.sort_by_key(|(i, _)| *i);

    let mut created = 0;
    let mut keyed_ids = std::collections::HashSet::new();
    for (i, (status, body)) in &answers {
        let i = *i;
        assert!(*status == 201 || *status == 200, "enqueue {i}: {status} {body}");
        if i < 30 {
            assert_eq!(*status, 201, "{body}");
            assert_eq!(body["payload"], json!(i), "each request answers its own job");
        } else {
            keyed_ids.insert(body["id"].as_str().unwrap().to_owned());
        }
        if *status == 201 {
            created += 1;
        }
    }
    assert_eq!(created, 31, "30 distinct jobs and one for the shared key");
    assert_eq!(
        keyed_ids.len(),
        1,
        "every request with the key answers the same job"
    );
    let jobs: i64 = db
        .client()
        .await
        .query_one("SELECT count(*) FROM jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(jobs, 31);

    // Written in fewer statements than requests (group commit: while one
    // batch commits, the next gathers), counted as enqueue batches.
    let (_, metrics) = c.api.get_text("/metrics").await;
    let batches = metric(&metrics, "runlease_batch_size_count{kind=\"enqueue\"}");
    assert!(
        (1.0..40.0).contains(&batches),
        "enqueue batches: {batches}\n{metrics}"
    );

    // And every one is claimable.
    let leases = c.api.claim("q", "w", 50).await;
    assert_eq!(leases.len(), 31);
}

/// How many PUBLISH commands the Redis on `port` has served.
fn publishes(port: u16) -> u64 {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "commandstats"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli (is it installed?): {e}"));
    let stats = String::from_utf8(out.stdout).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn concurrent_single_enqueues_are_announced_once_per_batch() {
    let db = TestDb::new().await;
    let redis = runlease_tests::TestRedis::start().await;
    let url = redis.url();
    let c = TestCoordinator::start_with(&db, |cfg| cfg.redis.url = url).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.api.get("/readyz").await.1["redis"] != "ok" {
        assert!(Instant::now() < deadline, "Redis never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = publishes(redis.port);
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..40 {
        let api = c.api.clone();
        sends.spawn(async move { api.post("/v1/jobs", &json!({"queue": "q", "payload": i})).await });
    }
    for (status, body) in sends.join_all().await {
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["state"], "queued", "{body}");
    }
    // Each batch was announced once, when it committed, before its
    // requests were answered: one wake-up for its queue, not one per job.
    let (_, metrics) = c.api.get_text("/metrics").await;
    let batches = metric(&metrics, "runlease_batch_size_count{kind=\"enqueue\"}");
    assert!((1.0..40.0).contains(&batches), "enqueue batches: {batches}");
    assert_eq!((publishes(redis.port) - before) as f64, batches);
    assert_eq!(c.api.claim("q", "w", 50).await.len(), 40);
}

#[tokio::test]
async fn a_value_postgres_refuses_in_an_enqueue_batch_fails_only_its_own_request() {
    let db = TestDb::new().await;
    // PostgreSQL refuses (SQLSTATE class 22) the job whose payload is "bad".
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION refuse_bad() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.payload = '\"bad\"'::jsonb THEN
                 RAISE EXCEPTION 'bad refused' USING ERRCODE = '22023';
               END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_bad BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION refuse_bad();",
        )
        .await
        .unwrap();
    let c = TestCoordinator::start(&db).await;
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..30 {
        let api = c.api.clone();
        let payload = if i == 7 { json!("bad") } else { json!(i) };
        sends.spawn(async move {
            (
                i,
                api.post("/v1/jobs", &json!({"queue": "q", "payload": payload}))
                    .await,
            )
        });
    }
    for (i, (status, body)) in sends.join_all().await {
        if i == 7 {
            assert_eq!(status, 422, "{body}");
        } else {
            assert_eq!(status, 201, "enqueue {i}: {body}");
        }
    }
    let leases = c.api.claim("q", "w", 50).await;
    assert_eq!(leases.len(), 29);
}

#[tokio::test]
async fn an_enqueue_batch_keeps_what_each_job_set_and_gives_the_rest_their_defaults() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let (status, body) = c
        .api
        .patch(
            "/v1/queues/qp",
            &json!({"max_attempts": 3, "retry_window_ms": 600000}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // The statement sends a field no job of the batch sets as one NULL, and
    // writes without the idempotency arbiter when no job has a key: each
    // shape must keep every job's own values.
    let all = json!({"queue": "qp", "payload": "all", "priority": -5, "delay_ms": 3_600_000,
        "max_attempts": 7, "backoff": {"base_ms": 10, "max_ms": 20, "factor": 2, "jitter": 0.5},
        "retry_window_ms": 5000, "timeout_ms": 1234, "concurrency_key": "ck",
        "idempotency_key": "kept"});
    let bare = json!({"queue": "qp", "payload": "bare"});
    let other = json!({"queue": "plain", "payload": "other", "run_at": "2030-01-01T00:00:00Z"});
    for (name, batch) in [
        ("mixed", vec![all.clone(), bare.clone(), other.clone()]),
        ("without keys", vec![bare.clone(), other.clone()]),
    ] {
        let (status, body) = c.api.post("/v1/jobs/batch", &json!({"jobs": batch})).await;
        assert_eq!(status, 201, "{name}: {body}");
        let ids: Vec<uuid::Uuid> = body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_str().unwrap().parse().unwrap())
            .collect();
        let rows = db
            .client()
            .await
            .query(
                "SELECT payload #>> '{}' AS p, priority, max_attempts, timeout_ms, concurrency_key,
                        idempotency_key, backoff_base_ms, backoff_max_ms, backoff_factor, backoff_jitter,
                        retry_window_ms, run_at > now() + interval '50 minutes' AS later,
                        run_at = '2030-01-01T00:00:00Z' AS fixed
                 FROM jobs WHERE id = ANY($1) ORDER BY array_position($1, id)",
                &[&ids],
            )
            .await
            .unwrap();
        let of = |p: &str| rows.iter().find(|r| r.get::<_, String>("p") == p);
        if let Some(r) = of("all") {
            assert_eq!(r.get::<_, i32>("priority"), -5);
            assert_eq!(r.get::<_, i32>("max_attempts"), 7);
            assert_eq!(r.get::<_, Option<i64>>("timeout_ms"), Some(1234));
            assert_eq!(
                r.get::<_, Option<String>>("concurrency_key").as_deref(),
                Some("ck")
            );
            assert_eq!(
                r.get::<_, Option<String>>("idempotency_key").as_deref(),
                Some("kept")
            );
            assert_eq!(r.get::<_, Option<i64>>("backoff_base_ms"), Some(10));
            assert_eq!(r.get::<_, Option<i64>>("backoff_max_ms"), Some(20));
            assert_eq!(r.get::<_, Option<f64>>("backoff_factor"), Some(2.0));
            assert_eq!(r.get::<_, Option<f64>>("backoff_jitter"), Some(0.5));
            assert_eq!(r.get::<_, Option<i64>>("retry_window_ms"), Some(5000));
            assert!(r.get::<_, bool>("later"), "its delay");
        }
        let bare_row = of("bare").unwrap_or_else(|| panic!("{name}: the bare job"));
        assert_eq!(bare_row.get::<_, i32>("priority"), 0, "{name}");
        assert_eq!(
            bare_row.get::<_, i32>("max_attempts"),
            3,
            "{name}: the queue's budget"
        );
        assert_eq!(
            bare_row.get::<_, Option<i64>>("retry_window_ms"),
            Some(600000),
            "{name}"
        );
        assert_eq!(bare_row.get::<_, Option<i64>>("timeout_ms"), None, "{name}");
        assert_eq!(
            bare_row.get::<_, Option<String>>("idempotency_key"),
            None,
            "{name}"
        );
        assert_eq!(bare_row.get::<_, Option<i64>>("backoff_base_ms"), None, "{name}");
        assert!(!bare_row.get::<_, bool>("later"), "{name}: due now");
        let other_row = of("other").unwrap_or_else(|| panic!("{name}: the other job"));
        assert!(other_row.get::<_, bool>("fixed"), "{name}: its run_at");
        assert_eq!(
            other_row.get::<_, i32>("max_attempts"),
            4,
            "{name}: the default budget"
        );
    }
    // The key is still an arbiter in a batch that mixes keyed and unkeyed
    // jobs: the repeat answers the original, the job beside it is new.
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/batch",
            &json!({"jobs": [bare, {"queue": "qp", "payload": "again", "idempotency_key": "kept"}]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["jobs"][1]["payload"], json!("all"), "the original: {body}");
    let count: i64 = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    assert_eq!(count, 6, "three, two, then one new job");
}
