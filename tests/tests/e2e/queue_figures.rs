//! The queue figures of `/metrics` and `/v1/queues` while they are read in
//! the background (`runlease_coordinator::figures`): the same as a read at
//! that moment once the loop has read again, for every state and tally; one
//! queue's page taken from them with its settings read at once; and on a
//! small table, read at the moment they are asked.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use runlease_coordinator::figures::{Kind, QueueFiguresCache, Tuning};
use runlease_coordinator::store::queues::QueueFigures;
use runlease_protocol::{JobState, QueueName};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;
use tokio_util::sync::CancellationToken;

/// What the figures say of each queue: counts per state, tallies, and the
/// jobs ended lately (the age of the oldest job moves with the clock).
type Said = BTreeMap<String, (BTreeMap<JobState, i64>, i64, i64, BTreeMap<JobState, i64>)>;

fn said(figures: &[QueueFigures]) -> Said {
    figures
        .iter()
        .map(|f| {
            (
                f.queue.to_string(),
                (
                    f.counts.clone(),
                    f.lease_expiries,
                    f.retries,
                    f.ended_recently.clone(),
                ),
            )
        })
        .collect()
}

/// Counts per (queue, state) from the rows themselves.
async fn counted(db: &TestDb) -> BTreeMap<(String, String), i64> {
    db.client()
        .await
        .query(
            "SELECT queue, state::text, count(*) FROM jobs GROUP BY queue, state",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect()
}

/// Waits until the cache answers, for `kind`, what a read now answers, and
/// answers it.
async fn until_caught_up(cache: &QueueFiguresCache, db: &TestDb, kind: Kind) -> Vec<QueueFigures> {
    let store = db.store().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let answer = cache.figures(kind).await.unwrap();
        let now = store.queue_figures(None, kind == Kind::Page).await.unwrap();
        if said(&answer.figures) == said(&now) {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the background read never caught up: {:?} against {:?}",
            said(&answer.figures),
            said(&now)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every read counts as slow, whatever the table's size; the loop reads
/// every `refresh`.
fn always_slow(refresh: Duration) -> Tuning {
    Tuning {
        slow: Duration::ZERO,
        big_table: 0,
        refresh,
        ..Tuning::default()
    }
}

#[tokio::test]
async fn figures_read_in_the_background_catch_up_with_every_change() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let api = &c.api;
    // The figures always come from the loop.
    let cache = Arc::new(QueueFiguresCache::new(
        db.store().await,
        always_slow(Duration::from_millis(50)),
    ));
    let stop = CancellationToken::new();
    let looping = tokio::spawn(cache.clone().run(stop.clone()));

    for i in 0..20 {
        api.enqueue_attempts("fig", json!(i), 1).await;
    }
    api.enqueue("other", json!(0)).await;
    for kind in [Kind::Scrape, Kind::Page] {
        until_caught_up(&cache, &db, kind).await;
    }
    // Once slow, a request is answered the loop's figures (read before it).
    tokio::time::sleep(Duration::from_millis(1)).await;
    let answer = cache.figures(Kind::Scrape).await.unwrap();
    assert!(
        answer.age > Duration::ZERO,
        "a slow kind was read again for a request"
    );

    // Every way a job moves: claimed, completed, failed, released,
    // cancelled while queued.
    let leases = api.claim("fig", "w", 8).await;
    assert_eq!(leases.len(), 8);
    for l in &leases[..3] {
        assert_eq!(api.complete(l, json!(1)).await.0, 200);
    }
    assert_eq!(api.fail(&leases[3], "boom", false, None).await.0, 200);
    assert_eq!(api.release(&leases[4], None).await.0, 200);
    let queued = api.enqueue("fig", json!("late")).await;
    let (status, _) = api
        .post(&format!("/v1/jobs/{}/cancel", queued.id), &json!({}))
        .await;
    assert_eq!(status, 200);

    for kind in [Kind::Scrape, Kind::Page] {
        let figures = until_caught_up(&cache, &db, kind).await;
        let rows = counted(&db).await;
        let fig = figures.iter().find(|f| f.queue.as_str() == "fig").unwrap();
        for state in JobState::ALL {
            assert_eq!(
                fig.counts[&state],
                rows.get(&("fig".to_owned(), state.as_str().to_owned()))
                    .copied()
                    .unwrap_or(0),
                "{state:?} of fig ({kind:?})"
            );
        }
        if kind == Kind::Page {
            assert_eq!(fig.ended_recently.get(&JobState::Done), Some(&3));
            assert_eq!(fig.ended_recently.get(&JobState::Failed), Some(&1));
            assert_eq!(fig.ended_recently.get(&JobState::Cancelled), Some(&1));
        }
    }
    stop.cancel();
    looping.await.unwrap();
}

#[tokio::test]
async fn a_small_table_is_read_at_the_moment_it_is_asked() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let api = &c.api;
    let cache = Arc::new(QueueFiguresCache::new(db.store().await, Tuning::default()));
    let stop = CancellationToken::new();
    let looping = tokio::spawn(cache.clone().run(stop.clone()));
    for round in 1..=5_i64 {
        api.enqueue("small", json!(round)).await;
        for kind in [Kind::Scrape, Kind::Page] {
            let answer = cache.figures(kind).await.unwrap();
            assert_eq!(answer.age, Duration::ZERO);
            let small = answer
                .figures
                .iter()
                .find(|f| f.queue.as_str() == "small")
                .unwrap();
            assert_eq!(small.counts[&JobState::Queued], round);
        }
    }
    // And so through the API: a job enqueued is in the very next answer.
    api.enqueue("small", json!("last")).await;
    let (status, body) = api.get("/v1/queues").await;
    assert_eq!(status, 200);
    let small = body["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "small")
        .unwrap();
    assert_eq!(small["counts"]["queued"], 6, "{body}");
    assert_eq!(
        api.metric("runlease_queue_depth{queue=\"small\",state=\"queued\"}")
            .await,
        6.0
    );
    assert_eq!(api.metric("runlease_queue_figures_age_seconds").await, 0.0);
    stop.cancel();
    looping.await.unwrap();
}

#[tokio::test]
async fn one_queue_is_answered_from_the_background_read_with_its_settings_read_at_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let api = &c.api;
    // Nothing reads again (no loop runs), and the read kept stays young
    // enough: a request is answered the read it found.
    let hour = Duration::from_secs(3600);
    let cache = QueueFiguresCache::new(
        db.store().await,
        Tuning {
            max_age: hour,
            ..always_slow(hour)
        },
    );
    let one = QueueName::new("one".to_owned()).unwrap();
    let fresh = QueueName::new("fresh".to_owned()).unwrap();
    api.enqueue("one", json!(1)).await;
    // Read at once for this request, and kept: page reads are slow now.
    assert_eq!(cache.figures(Kind::Page).await.unwrap().age, Duration::ZERO);
    api.enqueue("one", json!(2)).await;
    let (status, _) = api
        .patch("/v1/queues/one", &json!({"paused": true, "max_running": 3}))
        .await;
    assert_eq!(status, 200);
    let (status, _) = api.patch("/v1/queues/fresh", &json!({"max_running": 7})).await;
    assert_eq!(status, 200);

    // The counts are the kept read's (one job), the settings today's.
    let figures = cache.queue(&one).await.unwrap();
    assert_eq!(figures.counts[&JobState::Queued], 1);
    assert!(figures.settings.paused);
    assert_eq!(figures.settings.max_running, Some(3));
    // A queue the kept read did not hold: no jobs, its settings.
    let figures = cache.queue(&fresh).await.unwrap();
    assert!(figures.counts.values().all(|n| *n == 0), "{:?}", figures.counts);
    assert_eq!(figures.settings.max_running, Some(7));
    assert!(!figures.settings.paused);

    // The coordinator's own figures, on this small table, are read at once.
    let (status, body) = api.get("/v1/queues/one").await;
    assert_eq!(status, 200);
    assert_eq!(body["counts"]["queued"], 2, "{body}");
    assert_eq!(body["settings"]["paused"], true, "{body}");
}
