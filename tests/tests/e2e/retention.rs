//! Retention: terminal jobs past their retention are deleted with their
//! attempts, and nothing else is; pruning runs on one replica at a time and
//! never holds up claims; the totals stay right after a prune.

use std::sync::Arc;
use std::time::Duration;

use runlease_coordinator::config::RetentionConfig;
use runlease_coordinator::metrics::Metrics;
use runlease_coordinator::prune::{Pruner, Retention};
use runlease_protocol::JobState;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const HOUR: Duration = Duration::from_secs(3600);
const DAY_MS: i64 = 86_400_000;

async fn pruner(db: &TestDb, retention: Retention, batch: i64) -> (Pruner, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new(Duration::from_secs(25)));
    let ms = |ms: i64| Duration::from_millis(u64::try_from(ms).unwrap());
    let settings = RetentionConfig {
        done: ms(retention.done_ms),
        failed: ms(retention.failed_ms),
        prune_interval: Duration::from_secs(3600),
        prune_batch: u32::try_from(batch).unwrap(),
    };
    let pruner = Pruner::new(
        db.store().await,
        metrics.clone(),
        settings,
        CancellationToken::new(),
    );
    (pruner, metrics)
}

/// Runs passes until one is not cut short by another holder of the prune
/// lock (the coordinator's own loop folds about every second under it);
/// answers the jobs pruned and the statements run over all of them.
async fn prune_through(pruner: &Pruner) -> (u64, u64) {
    let (mut pruned, mut statements) = (0, 0);
    for _ in 0..50 {
        let report = pruner.run_once().await.unwrap();
        pruned += report.pruned;
        statements += report.statements;
        if !report.busy {
            return (pruned, statements);
        }
    }
    panic!("the prune lock stayed taken for 50 passes");
}

async fn existing(db: &TestDb, ids: &[Uuid]) -> (i64, i64) {
    let jobs = db
        .scalar("SELECT count(*) FROM jobs WHERE id = ANY($1)", &[&ids.to_vec()])
        .await;
    let attempts = db
        .scalar(
            "SELECT count(*) FROM job_attempts WHERE job_id = ANY($1)",
            &[&ids.to_vec()],
        )
        .await;
    (jobs, attempts)
}

#[tokio::test]
async fn pruning_removes_exactly_the_expired_terminal_jobs_and_their_attempts() {
    let db = TestDb::new().await;
    // The repair loop would re-queue the job made enqueue_failed below (it
    // re-sends the wake-up such a job missed) before the counts are read.
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.redis.repair_interval = std::time::Duration::from_millis(3_600_000)
    })
    .await;
    // Live jobs in every live state, made through the API, then made old:
    // age alone never prunes a job that is not terminal.
    let queued = c.api.enqueue("q", json!("queued")).await;
    let stuck = c.api.enqueue("q", json!("enqueue_failed")).await;
    let running = c.api.enqueue("q", json!("running")).await;
    let leases = c.api.claim("q", "w", 3).await;
    assert_eq!(leases.len(), 3);
    for lease in leases.iter().filter(|l| l.job_id != running.id) {
        assert_eq!(c.api.release(lease, None).await.0, 200);
    }
    // (Marked as the coordinator's own statements are: it changes no tally,
    // and a recount must not cover up a prune's wrong delta below.)
    db.execute_marked(
        "UPDATE jobs SET state = 'enqueue_failed' WHERE id = $1",
        &[&stuck.id.0],
    )
    .await;
    let client = db.client().await;
    client
        .execute(
            "UPDATE jobs SET created_at = now() - interval '400 days', run_at = now() - interval '400 days' WHERE queue = 'q'",
            &[],
        )
        .await
        .unwrap();
    // Terminal jobs on both sides of the retention, in every terminal state.
    let old_done = db
        .insert_terminal_jobs("q", JobState::Done, 40, 3 * 24 * HOUR)
        .await;
    let old_failed = db
        .insert_terminal_jobs("q", JobState::Failed, 30, 40 * 24 * HOUR)
        .await;
    let old_cancelled = db
        .insert_terminal_jobs("q", JobState::Cancelled, 20, 40 * 24 * HOUR)
        .await;
    let new_done = db.insert_terminal_jobs("q", JobState::Done, 10, HOUR).await;
    let new_failed = db
        .insert_terminal_jobs("q", JobState::Failed, 10, 20 * 24 * HOUR)
        .await;
    // A queue that keeps its done jobs forever (override 0) and its failed
    // ones for a day.
    let (status, _) = c
        .api
        .patch(
            "/v1/queues/keep",
            &json!({"retention_done_ms": 0, "retention_failed_ms": DAY_MS}),
        )
        .await;
    assert_eq!(status, 200);
    let kept_forever = db
        .insert_terminal_jobs("keep", JobState::Done, 15, 300 * 24 * HOUR)
        .await;
    let keep_failed = db
        .insert_terminal_jobs("keep", JobState::Failed, 5, 2 * 24 * HOUR)
        .await;

    let retention = Retention {
        done_ms: 2 * DAY_MS,
        failed_ms: 30 * DAY_MS,
    };
    // Batches of 7: every expired row goes, over several statements.
    let (pruner, metrics) = pruner(&db, retention, 7).await;
    let (pruned, statements) = prune_through(&pruner).await;
    assert_eq!(pruned, 40 + 30 + 20 + 5);
    assert!(statements > 10, "bounded statements: {statements}");

    for gone in [&old_done, &old_failed, &old_cancelled, &keep_failed] {
        assert_eq!(
            existing(&db, gone).await,
            (0, 0),
            "expired jobs and their attempts are deleted"
        );
    }
    for kept in [&new_done, &new_failed, &kept_forever] {
        let n = kept.len() as i64;
        assert_eq!(existing(&db, kept).await, (n, n), "jobs within retention stay");
    }
    for live in [queued.id, stuck.id, running.id] {
        let state: String = client
            .query_one("SELECT state::text FROM jobs WHERE id = $1", &[&live.0])
            .await
            .unwrap()
            .get(0);
        assert_ne!(state, "", "live job {live} is still there");
    }
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM jobs WHERE state IN ('queued', 'enqueue_failed', 'running')",
            &[]
        )
        .await,
        3
    );
    let text = metrics.render();
    for (sample, n) in [
        (r#"runlease_jobs_pruned_total{queue="q",state="done"}"#, 40),
        (r#"runlease_jobs_pruned_total{queue="q",state="failed"}"#, 30),
        (r#"runlease_jobs_pruned_total{queue="q",state="cancelled"}"#, 20),
        (r#"runlease_jobs_pruned_total{queue="keep",state="failed"}"#, 5),
    ] {
        assert!(
            text.contains(&format!("{sample} {n}")),
            "{sample} {n} in:\n{text}"
        );
    }
    // A second pass finds nothing.
    assert_eq!(pruner.run_once().await.unwrap().pruned, 0);

    // The totals follow the deletes (the tallies), with no scan of history.
    let (status, q) = c.api.get("/v1/queues/q").await;
    assert_eq!(status, 200);
    assert_eq!(q["counts"]["done"], json!(10));
    assert_eq!(q["counts"]["failed"], json!(10));
    assert_eq!(q["counts"]["cancelled"], json!(0));
    assert_eq!(q["counts"]["queued"], json!(1));
    assert_eq!(q["counts"]["enqueue_failed"], json!(1));
    assert_eq!(q["counts"]["running"], json!(1));
    let (_, keep) = c.api.get("/v1/queues/keep").await;
    assert_eq!(keep["counts"]["done"], json!(15));
    assert_eq!(keep["counts"]["failed"], json!(0));
    assert_eq!(keep["settings"]["retention_done_ms"], json!(0));
    // The prune took its jobs off the tallies itself: no recount asked, and
    // none made by this test's pruner either.
    crate::tallies::no_recount_asked(&c.api, &db).await;
    assert!(
        metrics.render().contains("runlease_tally_recounts_total 0"),
        "the test's pruner made a recount"
    );
}

#[tokio::test]
async fn a_pruned_jobs_idempotency_key_may_be_used_again() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut req = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("q").unwrap(),
        json!(1),
    );
    req.idempotency_key = Some("k".into());
    let first = c.api.enqueue_with(req.clone()).await;
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(c.api.complete(&lease, json!("r")).await.0, 200);
    db.client()
        .await
        .execute(
            "UPDATE jobs SET finished_at = now() - interval '1 hour' WHERE id = $1",
            &[&first.id.0],
        )
        .await
        .unwrap();
    let (pruner, _) = pruner(
        &db,
        Retention {
            done_ms: 60_000,
            failed_ms: 60_000,
        },
        100,
    )
    .await;
    assert_eq!(prune_through(&pruner).await.0, 1);
    let second = c.api.enqueue_with(req).await;
    assert_ne!(second.id, first.id, "a new job under the old key");
}

#[tokio::test]
async fn two_pruners_at_once_delete_each_row_once_and_never_hold_up_claims() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let old = db
        .insert_terminal_jobs("history", JobState::Done, 6000, 2 * 24 * HOUR)
        .await;
    for i in 0..200 {
        c.api.enqueue("live", json!(i)).await;
    }
    let retention = Retention {
        done_ms: DAY_MS,
        failed_ms: DAY_MS,
    };
    let (a, metrics_a) = pruner(&db, retention, 50).await;
    let (b, metrics_b) = pruner(&db, retention, 50).await;
    let claims = {
        let api = c.api.clone();
        tokio::spawn(async move {
            let mut claimed = 0;
            while claimed < 200 {
                let leases = api.claim_wait("live", "w", 10, 5_000).await;
                assert!(!leases.is_empty(), "claims are served while pruning runs");
                for lease in &leases {
                    assert_eq!(api.complete(lease, json!("ok")).await.0, 200);
                }
                claimed += leases.len();
            }
            claimed
        })
    };
    // Both pruners run passes until the history is gone; whichever holds
    // the prune lock works, the other finds it busy.
    let mut pruned = 0;
    let mut busy = 0;
    for _ in 0..1000 {
        let (ra, rb) = tokio::join!(a.run_once(), b.run_once());
        for r in [ra.unwrap(), rb.unwrap()] {
            pruned += r.pruned;
            busy += u64::from(r.busy);
        }
        if existing(&db, &old).await == (0, 0) {
            break;
        }
    }
    assert_eq!(claims.await.unwrap(), 200);
    assert_eq!(existing(&db, &old).await, (0, 0));
    assert_eq!(pruned, 6000, "each row deleted once");
    assert!(busy > 0, "two passes at once: one found the lock taken");
    let counted = |m: &Metrics| {
        let text = m.render();
        text.lines()
            .find_map(|l| {
                l.strip_prefix(r#"runlease_jobs_pruned_total{queue="history",state="done"} "#)
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    assert_eq!(counted(&metrics_a) + counted(&metrics_b), 6000);
    // The 200 completed live jobs are within retention.
    assert_eq!(
        db.scalar(
            "SELECT count(*) FROM jobs WHERE queue = 'live' AND state = 'done'",
            &[]
        )
        .await,
        200
    );
}
