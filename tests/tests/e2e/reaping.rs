//! The reaper: expired leases come back once, whatever number of reapers run.

use std::sync::Arc;
use std::time::Duration;

use runlease_coordinator::metrics::Metrics;
use runlease_coordinator::reaper::{ReapReport, Reaper};
use runlease_coordinator::wake::Wake;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

use crate::expire_leases;

/// A reaper over `db`, as another coordinator would run it.
pub async fn reaper(db: &TestDb) -> Reaper {
    let metrics = Arc::new(Metrics::new(Duration::from_secs(25)));
    Reaper::new(
        db.store().await,
        metrics,
        Wake::local_only(),
        Duration::from_secs(1),
    )
}

/// One reaper pass over `db`.
pub async fn reap_once(db: &TestDb) -> ReapReport {
    reaper(db).await.run_once().await.unwrap()
}

#[tokio::test]
async fn two_reapers_at_once_requeue_each_expired_lease_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs: Vec<_> = (0..1200).map(|i| json!({"queue": "r", "payload": i})).collect();
    for chunk in jobs.chunks(600) {
        assert_eq!(c.api.post("/v1/jobs/batch", &json!({"jobs": chunk})).await.0, 201);
    }
    let mut ids = Vec::new();
    while ids.len() < 1200 {
        let leases = c.api.claim("r", "doomed", 400).await;
        assert!(!leases.is_empty());
        ids.extend(leases.iter().map(|l| l.job_id.0));
    }
    // A lease renewed a moment ago must survive: keep one live.
    let live = c.api.enqueue("r", json!("live")).await;
    let live_lease = c.api.claim_one("r", "alive").await;
    assert_eq!(live_lease.job_id, live.id);
    expire_leases(&db, &ids).await;

    // Two coordinators' reapers, each with its own pool, at the same moment.
    let (first, second) = (reaper(&db).await, reaper(&db).await);
    let a = tokio::spawn(async move { first.run_once().await.unwrap() });
    let b = tokio::spawn(async move { second.run_once().await.unwrap() });
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    assert_eq!(a.total() + b.total(), 1200, "reaped {a:?} + {b:?}");
    assert_eq!(a.requeued + b.requeued, 1200);

    let client = db.client().await;
    let expired: i64 = client
        .query_one(
            "SELECT count(*) FROM job_attempts WHERE outcome = 'lease_expired'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(expired, 1200, "one lease_expired attempt per job");
    let row = client
        .query_one("SELECT count(*) FILTER (WHERE state = 'queued' AND attempt = 1), count(*) FILTER (WHERE state = 'running') FROM jobs", &[])
        .await
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (1200, 1));
    assert_eq!(c.api.heartbeat(&live_lease).await, "renewed");
}
