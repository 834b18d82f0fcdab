//! Finishes of every kind and heartbeats racing over the same jobs never
//! deadlock: every statement that writes leases locks its rows in id order.

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use runlease_protocol::worker::Lease;
use runlease_tests::{TestCoordinator, TestDb, admin};
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// Puts `leases` in a new random order.
fn shuffle(leases: &mut [Lease]) {
    let order = RandomState::new();
    leases.sort_by_cached_key(|l| order.hash_one(l.job_id.0));
}

/// Deadlocks PostgreSQL counted in database `name`, once every backend of it
/// has gone (a backend publishes its counters when it exits).
async fn deadlocks_after_backends_left(name: &str) -> i64 {
    let admin = admin().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let open: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
                &[&name],
            )
            .await
            .unwrap()
            .get(0);
        if open == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} backends of {name} did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin
        .execute("SELECT pg_stat_clear_snapshot()", &[])
        .await
        .unwrap();
    admin
        .query_one(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn heartbeats_and_mixed_finish_batches_racing_over_the_same_jobs_never_deadlock() {
    let db = TestDb::new().await;
    let name = db.name.clone();
    let before = deadlocks_after_backends_left(&name).await;
    // Several batches of each kind in flight at once, on their own connections.
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.batching.flushers = 4;
        cfg.database.pool_size = 12;
    })
    .await;
    let jobs: Vec<Value> = (0..2000)
        .map(|i| json!({"queue": "race", "payload": i}))
        .collect();
    for chunk in jobs.chunks(100) {
        let (status, body) = c.api.post("/v1/jobs/batch", &json!({"jobs": chunk})).await;
        assert_eq!(status, 201, "{body}");
    }

    // Every lease handed out, shared by heartbeaters and finishers alike.
    let held: Arc<Mutex<Vec<Lease>>> = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::new(AtomicU64::new(0));
    // Each finisher runs a fixed number of cycles (however slow the machine);
    // heartbeaters race them until the last one is done.
    let finishing = Arc::new(AtomicU64::new(4));
    let mut tasks = Vec::new();
    for w in 0..4 {
        let (api, held, requests, finishing) =
            (c.api.clone(), held.clone(), requests.clone(), finishing.clone());
        // Finishers: claim, then finish a shuffled mix of complete, fail
        // (retried at once) and release, so jobs keep coming back.
        tasks.push(tokio::spawn(async move {
            let worker = format!("finisher-{w}");
            let mut cycles = 0;
            while cycles < 25 {
                let leases = api.claim_wait("race", &worker, 40, 100).await;
                requests.fetch_add(1, Ordering::Relaxed);
                held.lock().await.extend(leases.iter().cloned());
                let mut leases = leases;
                shuffle(&mut leases);
                let items: Vec<Value> = leases
                    .iter()
                    .enumerate()
                    .map(|(i, l)| match i % 3 {
                        0 => json!({"lease_token": l.lease_token, "action": "complete", "result": i}),
                        1 => json!({"lease_token": l.lease_token, "action": "fail", "error": "again", "retry_after_ms": 0}),
                        _ => json!({"lease_token": l.lease_token, "action": "release"}),
                    })
                    .collect();
                // (2,000 jobs outlast the 1,334 completes at most.)
                assert!(!items.is_empty(), "the queue ran dry");
                let (status, body) = api.post("/v1/finish", &json!({"items": items})).await;
                requests.fetch_add(1, Ordering::Relaxed);
                assert_eq!(status, 200, "finish: {body}");
                cycles += 1;
            }
            finishing.fetch_sub(1, Ordering::Relaxed);
        }));
    }
    for _ in 0..4 {
        let (api, held, requests, finishing) =
            (c.api.clone(), held.clone(), requests.clone(), finishing.clone());
        // Heartbeaters: renew shuffled sets of leases, finished or not.
        tasks.push(tokio::spawn(async move {
            while finishing.load(Ordering::Relaxed) > 0 {
                let mut leases: Vec<Lease> = {
                    let held = held.lock().await;
                    held.iter().rev().take(120).cloned().collect()
                };
                if leases.is_empty() {
                    tokio::task::yield_now().await;
                    continue;
                }
                shuffle(&mut leases);
                let body = json!({"leases": leases.iter().map(|l| json!({"lease_token": l.lease_token, "progress": {"at": 1}})).collect::<Vec<_>>()});
                let (status, answer) = api.post("/v1/heartbeat", &body).await;
                requests.fetch_add(1, Ordering::Relaxed);
                assert_eq!(status, 200, "heartbeat: {answer}");
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let sent = requests.load(Ordering::Relaxed);
    assert!(sent > 200, "the race sent only {sent} requests");
    let (_, metrics) = c.api.get_text("/metrics").await;
    let retried: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("runlease_db_retries_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let retries: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("runlease_db_retries_total"))
        .collect();
    let retries = retries.join("\n");
    c.stop().await.unwrap();
    assert_eq!(
        deadlocks_after_backends_left(&name).await,
        before,
        "PostgreSQL detected a deadlock ({sent} requests)"
    );
    assert_eq!(retried, 0.0, "no statement needed a retry: {retries}");
}

/// Holds an uncommitted cancel request on `job` in a session of its own,
/// runs `call` (which must then wait on that row lock), commits once the
/// call's backend waits on the lock, and answers what `call` answered.
async fn behind_a_cancel_request<T: Send + 'static>(
    db: &TestDb,
    job: uuid::Uuid,
    call: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    let mut holder = db.client().await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        "UPDATE jobs SET cancel_requested_at = now() WHERE id = $1",
        &[&job],
    )
    .await
    .unwrap();
    let answer = tokio::spawn(call);
    let watcher = db.client().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the call never waited on the row");
        tokio::task::yield_now().await;
    }
    tx.commit().await.unwrap();
    answer.await.unwrap()
}

#[tokio::test]
async fn a_heartbeat_waiting_on_a_cancel_request_answers_cancel_requested() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    c.api.enqueue("hb", json!(1)).await;
    let lease = c.api.claim_one("hb", "w").await;
    let api = c.api.clone();
    let held = lease.clone();
    let status =
        behind_a_cancel_request(&db, lease.job_id.0, async move { api.heartbeat(&held).await }).await;
    assert_eq!(status, "cancel_requested");
}

#[tokio::test]
async fn a_fail_waiting_on_a_cancel_request_sees_it_and_cancels() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    c.api.enqueue("f", json!(1)).await;
    let lease = c.api.claim_one("f", "w").await;
    let api = c.api.clone();
    let held = lease.clone();
    let (status, body) = behind_a_cancel_request(&db, lease.job_id.0, async move {
        api.fail(&held, "stopped", true, None).await
    })
    .await;
    assert_eq!(status, 200, "{body}");
    // The next state was computed on the row as the update found it after
    // the wait: with the cancel request, not queued again.
    assert_eq!(body["state"], "cancelled", "{body}");
    assert_eq!(c.api.job(lease.job_id).await.state.as_str(), "cancelled");
}
