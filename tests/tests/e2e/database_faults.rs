//! Database connections that die without closing: a proxy between the
//! coordinator and PostgreSQL freezes every connection open at one instant
//! (bytes held, nothing closed) while later connections work, or holds new
//! connections too. Requests answer within their deadline, the reaper and
//! the finish batches recover by themselves, and nothing is lost or doubled.

use std::time::{Duration, Instant};

use runlease_protocol::JobState;
use runlease_tests::{Api, Proxy, TestCoordinator, TestDb};
use serde_json::json;

/// Every request must answer within this long of being sent.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

async fn through_proxy(
    db: &TestDb,
    proxy: &Proxy,
    tweak: impl FnOnce(&mut runlease_coordinator::config::Config),
) -> TestCoordinator {
    let url = format!("postgres://postgres@{}/{}?sslmode=disable", proxy.addr, db.name);
    TestCoordinator::start_with(db, |cfg| {
        cfg.database.url = url;
        tweak(cfg);
    })
    .await
}

/// Enqueues 200 jobs at once, each its own batch request (single
/// enqueues would share transactions, and so connections), so the pool
/// holds several connections, all of them used just now.
async fn warm_pool(api: &Api) {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..200 {
        let api = api.clone();
        set.spawn(async move {
            api.post(
                "/v1/jobs/batch",
                &json!({"jobs": [{"queue": "warm", "payload": i}]}),
            )
            .await
            .0
        });
    }
    while let Some(status) = set.join_next().await {
        assert_eq!(status.unwrap(), 201);
    }
}

async fn timed<T>(work: impl std::future::Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = work.await;
    (out, started.elapsed())
}

#[tokio::test]
async fn a_frozen_database_connection_is_given_up_in_time_and_recovery_goes_on() {
    let db = TestDb::new().await;
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    // The lease of the job being finished outlives the frozen call (its
    // deadline, about 6 s) and its retry: a shorter one could be reaped
    // first, by a reaper whose next connection is a fresh one, and the
    // retry would rightly be refused.
    const TTL: Duration = Duration::from_secs(10);
    let c = through_proxy(&db, &proxy, |cfg| {
        cfg.leases.ttl = TTL;
        cfg.leases.heartbeat_interval = std::time::Duration::from_millis(2_500);
        cfg.leases.reaper_interval = std::time::Duration::from_millis(500);
    })
    .await;
    let abandoned = c.api.enqueue("q", json!("abandoned")).await;
    let _gone = c.api.claim_one("q", "gone-worker").await;
    let finishing = c.api.enqueue("q2", json!("finishing")).await;
    let lease = c.api.claim_one("q2", "w").await;
    warm_pool(&c.api).await;

    proxy.freeze();
    let frozen_at = Instant::now();
    let complete = json!({"lease_token": lease.lease_token, "result": "ok"});
    let ((complete_status, complete_body), complete_took) =
        timed(c.api.post("/v1/complete", &complete)).await;
    let ((enqueue_status, _), enqueue_took) =
        timed(c.api.post("/v1/jobs", &json!({"queue": "q3", "payload": 1}))).await;
    let ((ready_status, _), ready_took) = timed(c.api.get("/readyz")).await;
    for (what, took) in [
        ("complete", complete_took),
        ("enqueue", enqueue_took),
        ("readyz", ready_took),
    ] {
        assert!(took < ANSWER_WITHIN, "{what} answered after {took:?}");
    }
    eprintln!(
        "after the freeze: complete answered {complete_status} in {complete_took:?}, enqueue {enqueue_status} in {enqueue_took:?}, readyz {ready_status} in {ready_took:?}"
    );
    // The batch that met a frozen connection says so: never a success it
    // cannot vouch for.
    assert_eq!(complete_status, 503, "{complete_body}");
    assert_eq!(complete_body["error"]["code"], json!("overloaded"));
    assert!([201, 503].contains(&enqueue_status));
    assert!([200, 503].contains(&ready_status));

    // Its retry lands, once.
    let retried_at = Instant::now();
    loop {
        let ((status, body), took) = timed(c.api.post("/v1/complete", &complete)).await;
        assert!(took < ANSWER_WITHIN, "a retry answered after {took:?}");
        if status == 200 {
            assert_eq!(body["state"], json!("done"));
            eprintln!(
                "the retried complete landed {:?} after the freeze",
                frozen_at.elapsed()
            );
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(
            retried_at.elapsed() < Duration::from_secs(30),
            "the complete never landed"
        );
    }
    let job = c.api.job(finishing.id).await;
    assert_eq!(job.state, JobState::Done);
    assert_eq!(job.attempts.len(), 1);
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM job_attempts WHERE job_id = $1",
            &[&finishing.id.0]
        )
        .await,
        1,
        "the completion is recorded once"
    );

    // The lease abandoned before the freeze is reaped within TTL + 10 s.
    loop {
        let job = c.api.job(abandoned.id).await;
        if job.state == JobState::Queued {
            eprintln!(
                "the abandoned lease was reaped {:?} after the freeze",
                frozen_at.elapsed()
            );
            assert_eq!(
                job.attempts.first().and_then(|a| a.outcome),
                Some(runlease_protocol::AttemptOutcome::LeaseExpired)
            );
            break;
        }
        assert!(
            frozen_at.elapsed() < TTL + Duration::from_secs(10),
            "the abandoned lease was not reaped within TTL + 10 s of the freeze"
        );
        tokio::task::yield_now().await;
    }
    // Fresh work goes through, and the timeouts were counted.
    let fresh = c.api.enqueue("after", json!(1)).await;
    let lease = c.api.claim_one("after", "w").await;
    assert_eq!(lease.job_id, fresh.id);
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    assert_eq!(c.api.get("/readyz").await.0, 200);
    let (_, metrics) = c.api.get_text("/metrics").await;
    let timeouts: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("runlease_db_timeouts_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(timeouts >= 1.0, "timed-out operations are counted:\n{metrics}");
    assert!(!metrics.contains("status=\"5xx\",") || !metrics.contains("status=\"500\""));
    drop(proxy);
}

#[tokio::test]
async fn a_coordinator_under_steady_load_keeps_serving_through_a_freeze() {
    let db = TestDb::new().await;
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let c = through_proxy(&db, &proxy, |_| {}).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let mut load = tokio::task::JoinSet::new();
    for w in 0..8 {
        let api = c.api.clone();
        let stop = stop.clone();
        load.spawn(async move {
            while !stop.is_cancelled() {
                let (status, _) = api.post("/v1/jobs", &json!({"queue": "steady", "payload": w})).await;
                assert!([201, 503].contains(&status), "enqueue answered {status}");
                let (status, body) = api
                    .post(
                        "/v1/claim",
                        &json!({"queues": ["steady"], "worker_id": format!("w{w}"), "max_jobs": 1, "wait_ms": 100}),
                    )
                    .await;
                assert!([200, 503].contains(&status), "claim answered {status}");
                if let Some(token) = body["leases"][0]["lease_token"].as_str() {
                    // A complete answered 503 is simply retried: it is idempotent.
                    loop {
                        let (status, _) = api
                            .post("/v1/complete", &json!({"lease_token": token, "result": "ok"}))
                            .await;
                        assert!([200, 503].contains(&status), "complete answered {status}");
                        if status == 200 || stop.is_cancelled() {
                            break;
                        }
                    }
                }
            }
        });
    }
    let done = |db: &TestDb| {
        let db_url = db.url.clone();
        async move {
            let (client, conn) = tokio_postgres::connect(&db_url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let n: i64 = client
                .query_one(
                    "SELECT count(*) FROM jobs WHERE queue = 'steady' AND state = 'done'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            n
        }
    };
    let started = Instant::now();
    while done(&db).await < 100 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the load never got going"
        );
        tokio::task::yield_now().await;
    }
    proxy.freeze();
    let frozen_at = Instant::now();
    let before = done(&db).await;
    // Work completes again after the freeze, well within the deadlines.
    while done(&db).await < before + 200 {
        assert!(
            frozen_at.elapsed() < Duration::from_secs(20),
            "the coordinator stopped serving after the freeze"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("200 more jobs done {:?} after the freeze", frozen_at.elapsed());
    stop.cancel();
    while let Some(worker) = load.join_next().await {
        worker.unwrap();
    }
    // Every done job was completed exactly once.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM jobs j WHERE queue = 'steady' AND state = 'done'
               AND (SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id AND a.outcome = 'completed') <> 1",
            &[]
        )
        .await,
        0
    );
}

#[tokio::test]
async fn after_new_connections_are_blackholed_for_20_s_the_coordinator_recovers_by_itself() {
    let db = TestDb::new().await;
    let proxy = Proxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let c = through_proxy(&db, &proxy, |cfg| {
        cfg.leases.reaper_interval = std::time::Duration::from_millis(500)
    })
    .await;
    warm_pool(&c.api).await;
    proxy.blackhole(true);
    proxy.freeze();
    let outage = Instant::now();
    // While the network is gone every request still answers in time.
    while outage.elapsed() < Duration::from_secs(20) {
        let ((status, body), took) =
            timed(c.api.post("/v1/jobs", &json!({"queue": "q", "payload": 1}))).await;
        assert!(took < ANSWER_WITHIN, "an enqueue answered after {took:?}");
        assert_eq!(status, 503, "{body}");
        let ((status, _), took) = timed(c.api.get("/readyz")).await;
        assert!(took < ANSWER_WITHIN);
        assert_eq!(status, 503);
        assert_eq!(c.api.get("/healthz").await.0, 200, "the process itself is fine");
    }
    proxy.blackhole(false);
    let back = Instant::now();
    loop {
        let (status, _) = c.api.post("/v1/jobs", &json!({"queue": "q", "payload": 2})).await;
        if status == 201 {
            break;
        }
        assert!(
            back.elapsed() < Duration::from_secs(15),
            "no recovery after the network came back"
        );
    }
    let recovered = back.elapsed();
    eprintln!("enqueues succeed again {recovered:?} after the network came back");
    assert!(
        recovered < Duration::from_secs(15),
        "recovered {recovered:?} after the network came back"
    );
    assert_eq!(c.api.get("/readyz").await.0, 200);
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
}
