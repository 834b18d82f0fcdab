//! Redis wake-ups between coordinators, and what happens when Redis is gone:
//! it is a hint, never the truth.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runlease_client::protocol::{QueueName, WorkerId};
use runlease_client::{Client, JobContext, JobError, Worker};
use runlease_tests::{
    Api, CoordinatorProcess, SLOW_RECHECK_MS, TestCoordinator, TestDb, TestRedis, WOKEN_WITHIN,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Slow timers, so only a Redis wake-up can answer a parked call quickly.
fn slow_timers(redis: &TestRedis) -> Vec<(&'static str, String)> {
    vec![
        ("RUNLEASE_REDIS_URL", redis.url()),
        ("RUNLEASE_CLAIM_RECHECK_MS", SLOW_RECHECK_MS.to_string()),
    ]
}

/// Two coordinator processes over one database with slow timers, both
/// subscribed to Redis (once `/readyz` says so).
async fn two_coordinators() -> (TestDb, TestRedis, CoordinatorProcess, CoordinatorProcess) {
    let db = TestDb::new().await;
    let redis = TestRedis::start().await;
    let a = CoordinatorProcess::start(&db, &slow_timers(&redis)).await;
    let b = CoordinatorProcess::start(&db, &slow_timers(&redis)).await;
    wait_for_redis(&a.api, "ok").await;
    wait_for_redis(&b.api, "ok").await;
    (db, redis, a, b)
}

#[tokio::test]
async fn a_claim_parked_on_one_coordinator_wakes_on_an_enqueue_through_another() {
    let (_db, _redis, a, b) = two_coordinators().await;

    let api_b = b.api.clone();
    let parked = tokio::spawn(async move {
        let leases = api_b.claim_wait("cross", "on-b", 1, 25_000).await;
        (leases, Instant::now())
    });
    // Parked on B: it has looked at the empty queue and waits.
    b.api.until_claims_parked(1).await;
    let enqueued_at = Instant::now();
    let job = a.api.enqueue("cross", json!("through A")).await;
    let (leases, answered_at) = parked.await.unwrap();
    assert_eq!(leases.first().map(|l| l.job_id), Some(job.id));
    let woken = answered_at - enqueued_at;
    assert!(
        woken < WOKEN_WITHIN,
        "woken through Redis, not by the re-check timer ({woken:?})"
    );

    // A read parked on A answers when the job is completed through B.
    let api_a = a.api.clone();
    let read = tokio::spawn(async move {
        let (status, body) = api_a.get(&format!("/v1/jobs/{}?wait_ms=25000", job.id)).await;
        (status, body, Instant::now())
    });
    a.api.until_reads_parked(1).await;
    let completed_at = Instant::now();
    assert_eq!(b.api.complete(&leases[0], json!("done on B")).await.0, 200);
    let (status, body, answered_at) = read.await.unwrap();
    assert_eq!((status, body["state"].as_str()), (200, Some("done")));
    let woken = answered_at - completed_at;
    assert!(
        woken < WOKEN_WITHIN,
        "woken through Redis, not by the re-check timer ({woken:?})"
    );
}

/// Waits until `/readyz` reports Redis as `status`.
async fn wait_for_redis(api: &Api, status: &str) {
    for _ in 0..400 {
        if api.get("/readyz").await.1["redis"] == status {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("/readyz never reported redis {status:?}");
}

async fn count_in(db: &TestDb, state: &str) -> i64 {
    db.scalar("SELECT count(*) FROM jobs WHERE state::text = $1", &[&state])
        .await
}

#[tokio::test]
async fn with_redis_down_enqueues_are_marked_then_repaired_and_workers_finish_everything() {
    let db = TestDb::new().await;
    let mut redis = TestRedis::start().await;
    let url = redis.url();
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.redis.url = url;
        cfg.redis.repair_interval = std::time::Duration::from_millis(100);
        cfg.leases.claim_recheck = std::time::Duration::from_millis(200);
    })
    .await;
    // The subscription comes up in the background after start.
    wait_for_redis(&c.api, "ok").await;

    let stop = CancellationToken::new();
    let worker = Worker::builder(Client::new(c.api.base()).unwrap())
        .worker_id(WorkerId::new("w").unwrap())
        .claim_wait(Duration::from_secs(2))
        .handle(QueueName::new("busy").unwrap(), |ctx: JobContext| async move {
            Ok::<_, JobError>(ctx.raw_payload().clone())
        })
        .build()
        .unwrap();
    let run = tokio::spawn(worker.run(stop.clone()));

    redis.stop();
    // Enqueues still succeed; their wake-up cannot go out.
    let mut marked = 0;
    for i in 0..20 {
        let (status, body) = c
            .api
            .post("/v1/jobs", &json!({"queue": "busy", "payload": i}))
            .await;
        assert_eq!(status, 201, "{body}");
        if body["state"] == "enqueue_failed" {
            marked += 1;
        }
    }
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/batch",
            &json!({"jobs": (0..10).map(|i| json!({"queue": "idle", "payload": i})).collect::<Vec<Value>>()}),
        )
        .await;
    assert_eq!(status, 201);
    assert!(
        body["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["state"] == "enqueue_failed"),
        "{body}"
    );
    assert!(marked > 0, "enqueues during the outage are marked enqueue_failed");
    let (status, ready) = c.api.get("/readyz").await;
    assert_eq!(
        (status, ready["redis"].as_str()),
        (200, Some("degraded")),
        "Redis down is degraded, not down"
    );

    // The worker still finishes every job through the timer re-check.
    for _ in 0..400 {
        if count_in(&db, "done").await == 20 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count_in(&db, "done").await, 20);
    assert_eq!(
        count_in(&db, "enqueue_failed").await,
        10,
        "nobody claims the idle queue"
    );

    // Redis returns: the repair loop re-sends and moves them to queued.
    redis.resume().await;
    for _ in 0..400 {
        if count_in(&db, "enqueue_failed").await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        count_in(&db, "enqueue_failed").await,
        0,
        "no job left in enqueue_failed"
    );
    assert_eq!(count_in(&db, "queued").await, 10);
    let (_, metrics) = c.api.get_text("/metrics").await;
    assert!(
        metrics.contains("runlease_enqueue_failed_repairs_total{queue=\"idle\"} 10"),
        "{metrics}"
    );
    assert!(
        metrics.contains("runlease_enqueue_failed_marks_total{queue=\"idle\"} 10"),
        "{metrics}"
    );
    // Marking and repairing change no tally.
    crate::tallies::no_recount_asked(&c.api, &db).await;
    // Resubscribed after Redis came back.
    wait_for_redis(&c.api, "ok").await;
    stop.cancel();
    assert_eq!(run.await.unwrap().completed, 20);
}

#[tokio::test]
async fn three_coordinators_and_thirty_workers_finish_three_thousand_jobs_once() {
    let db = TestDb::new().await;
    let redis = TestRedis::start().await;
    let mut coordinators = Vec::new();
    for _ in 0..3 {
        let url = redis.url();
        coordinators.push(
            TestCoordinator::start_with(&db, |cfg| {
                cfg.redis.url = url;
                cfg.database.pool_size = 6;
                cfg.leases.ttl = std::time::Duration::from_millis(5_000);
                cfg.leases.heartbeat_interval = std::time::Duration::from_millis(1_000);
                cfg.leases.reaper_interval = std::time::Duration::from_millis(200);
                cfg.redis.repair_interval = std::time::Duration::from_millis(200);
            })
            .await,
        );
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..30 {
        let runs = runs.clone();
        let worker = Worker::builder(Client::new(coordinators[w % 3].api.base()).unwrap())
            .worker_id(WorkerId::new(format!("w{w}")).unwrap())
            .concurrency(2)
            .claim_wait(Duration::from_secs(5))
            .handle(QueueName::new("spread").unwrap(), move |ctx: JobContext| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, JobError>(ctx.raw_payload().clone())
                }
            })
            .build()
            .unwrap();
        workers.push(tokio::spawn(worker.run(stop.clone())));
    }
    // Producers enqueue through every coordinator while the workers run.
    for chunk in 0..30 {
        let jobs: Vec<Value> = (0..100)
            .map(|i| json!({"queue": "spread", "payload": chunk * 100 + i}))
            .collect();
        let (status, _) = coordinators[chunk % 3]
            .api
            .post("/v1/jobs/batch", &json!({"jobs": jobs}))
            .await;
        assert_eq!(status, 201);
    }
    for _ in 0..1200 {
        if count_in(&db, "done").await == 3000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let mut completed = 0;
    for w in workers {
        completed += w.await.unwrap().completed;
    }
    assert_eq!(count_in(&db, "done").await, 3000, "nothing lost");
    assert_eq!(completed, 3000);
    assert_eq!(runs.load(Ordering::SeqCst), 3000, "no job ran twice");
    let client = db.client().await;
    let per_job: i64 = client
        .query_one(
            "SELECT count(*) FROM (SELECT job_id FROM job_attempts WHERE outcome = 'completed'
                                   GROUP BY job_id HAVING count(*) > 1) twice",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(per_job, 0, "every job done exactly once");
}

#[tokio::test]
async fn a_burst_of_terminal_jobs_wakes_every_read_parked_on_another_coordinator() {
    let (_db, _redis, a, b) = two_coordinators().await;
    // 300 jobs, each with a read parked on A; all finished through B in one
    // request, so their terminal signals leave B's outbox together.
    const JOBS: usize = 300;
    let mut ids = Vec::with_capacity(JOBS);
    for i in 0..JOBS {
        ids.push(b.api.enqueue("burst", json!(i)).await.id);
    }
    let mut reads = Vec::with_capacity(JOBS);
    for id in &ids {
        let api = a.api.clone();
        let id = *id;
        reads.push(tokio::spawn(async move {
            let (status, body) = api.get(&format!("/v1/jobs/{id}?wait_ms=25000")).await;
            (status, body["state"].as_str().map(str::to_owned), Instant::now())
        }));
    }
    a.api.until_reads_parked(JOBS as u32).await;
    let leases = b.api.claim("burst", "w", JOBS as u32).await;
    assert_eq!(leases.len(), JOBS);
    let items: Vec<Value> = leases
        .iter()
        .map(|l| json!({"lease_token": l.lease_token, "action": "complete", "result": null}))
        .collect();
    let finished_at = Instant::now();
    let (status, body) = b.api.post("/v1/finish", &json!({"items": items})).await;
    assert_eq!(status, 200, "{body}");
    for read in reads {
        let (status, state, answered_at) = read.await.unwrap();
        assert_eq!((status, state.as_deref()), (200, Some("done")));
        let woken = answered_at - finished_at;
        assert!(
            woken < WOKEN_WITHIN,
            "woken through Redis, not by the re-check timer ({woken:?})"
        );
    }
    assert_eq!(b.api.metric("runlease_redis_publish_failures_total").await, 0.0);
}
