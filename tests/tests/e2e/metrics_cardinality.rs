//! Queue names come from clients: `/metrics` holds at most
//! `RUNLEASE_METRICS_MAX_QUEUES` queue label values, and later queues share
//! `queue="(other)"`, with the overflow counted.

use std::collections::BTreeSet;

use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

/// Every `queue` label value in a /metrics answer.
fn queue_labels(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let start = l.find("queue=\"")? + "queue=\"".len();
            let len = l[start..].find('"')?;
            Some(l[start..start + len].to_owned())
        })
        .collect()
}

#[tokio::test]
async fn queues_past_the_metrics_cap_share_one_label() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| config.server.metrics_max_queues = 3).await;
    let queues: Vec<String> = (0..7).map(|i| format!("tenant-{i}")).collect();
    // The first three queues the coordinator meets keep their own label.
    for (i, q) in queues.iter().enumerate() {
        for n in 0..=i {
            c.api.enqueue(q, json!({"n": n})).await;
        }
    }
    let done = c.api.claim_one("tenant-6", "w").await;
    let (status, _) = c.api.complete(&done, json!("ok")).await;
    assert_eq!(status, 200);

    let (status, text) = c.api.get_text("/metrics").await;
    assert_eq!(status, 200);
    let labels = queue_labels(&text);
    let expected: BTreeSet<String> = ["tenant-0", "tenant-1", "tenant-2", "(other)"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(labels, expected, "queue label values in /metrics:\n{text}");

    let api = &c.api;
    for (i, q) in queues.iter().take(3).enumerate() {
        assert_eq!(
            api.metric(&format!("runlease_jobs_enqueued_total{{queue=\"{q}\"}}"))
                .await,
            (i + 1) as f64
        );
    }
    // tenant-3..6 enqueued 4 + 5 + 6 + 7 jobs; one of tenant-6's is done.
    assert_eq!(
        api.metric("runlease_jobs_enqueued_total{queue=\"(other)\"}")
            .await,
        22.0
    );
    assert_eq!(
        api.metric("runlease_jobs_claimed_total{queue=\"(other)\"}").await,
        1.0
    );
    assert_eq!(
        api.metric("runlease_jobs_completed_total{queue=\"(other)\"}")
            .await,
        1.0
    );
    // Depths of the folded queues add up (read from PostgreSQL at scrape time).
    assert_eq!(
        api.metric("runlease_queue_depth{queue=\"(other)\",state=\"queued\"}")
            .await,
        21.0
    );
    assert_eq!(
        api.metric("runlease_queue_depth{queue=\"(other)\",state=\"done\"}")
            .await,
        1.0
    );
    assert_eq!(
        api.metric("runlease_queue_depth{queue=\"tenant-2\",state=\"queued\"}")
            .await,
        3.0
    );
    assert_eq!(api.metric("runlease_metrics_queue_labels").await, 3.0);
    // 22 enqueues + 1 claim + 1 completion + 1 terminal (+ within the SLO)
    // were recorded under the overflow value, at least.
    let overflowed = api.metric("runlease_metrics_queue_overflow_total").await;
    assert!(overflowed >= 25.0, "overflow counter: {overflowed}");

    // The queue API still answers each queue by its own name.
    let (status, body) = api.get("/v1/queues").await;
    assert_eq!(status, 200);
    assert_eq!(body["queues"].as_array().unwrap().len(), 7);
    c.stop().await.unwrap();
}
