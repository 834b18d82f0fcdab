//! The dashboard draws a job's dependencies and dependents (links both
//! ways, with their states) and a queue's retry policy, in headless
//! Chromium against a coordinator process.

use serde_json::{Value, json};

use crate::dashboard::{coordinator, drive, screenshots};
use runlease_tests::TestDb;

fn id_of(jobs: &Value, i: usize) -> String {
    jobs["jobs"][i]["id"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn dashboard_draws_a_jobs_dependencies_and_dependents_and_the_queues_retry_policy() {
    let db = TestDb::new().await;
    let c = coordinator(&db, false).await;
    let api = &c.api;
    let (status, body) = api
        .patch(
            "/v1/queues/build",
            &json!({
                "max_attempts": 6,
                "backoff": {"base_ms": 2000, "max_ms": 60000, "factor": 3, "jitter": 0.5},
                "retry_window_ms": 3_600_000,
                "dead_letter_queue": "build-dead",
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // resize-a and resize-b, then page (waits on both), then publish (waits on page).
    let (status, jobs) = api
        .post(
            "/v1/jobs/batch",
            &json!({"jobs": [
                {"queue": "build", "payload": {"step": "resize-a"}, "ref": "a"},
                {"queue": "build", "payload": {"step": "resize-b"}, "ref": "b"},
                {"queue": "build", "payload": {"step": "page"}, "ref": "page", "depends_on": ["a", "b"]},
                {"queue": "build", "payload": {"step": "publish"}, "depends_on": ["page"]},
            ]}),
        )
        .await;
    assert_eq!(status, 201, "{jobs}");
    let (a, b, page, publish) = (id_of(&jobs, 0), id_of(&jobs, 1), id_of(&jobs, 2), id_of(&jobs, 3));

    // resize-a is done; resize-b still queued: page and publish stay blocked.
    let lease = api.claim_one("build", "w").await;
    assert_eq!(lease.job_id.to_string(), a, "the oldest job runs first");
    assert_eq!(api.complete(&lease, json!({"ok": true})).await.0, 200);
    let (status, page_job) = api.get(&format!("/v1/jobs/{page}")).await;
    assert_eq!(status, 200, "{page_job}");
    assert_eq!(page_job["state"], "blocked", "{page_job}");

    let report = drive(json!({
        "scenario": "graph",
        "base": api.base(),
        "screenshots": screenshots(&db),
        "graph": {
            "job": page,
            "dependencies": [{"id": a, "state": "done"}, {"id": b, "state": "queued"}],
            "dependents": [{"id": publish, "state": "blocked"}],
        },
        "queue": "build",
        "blocked": 2,
        "policy": ["6", "2 s", "1 m", "×3", "50%", "1 h", "build-dead"],
    }))
    .await;
    assert_eq!(report["dependencies_checked"], 3, "{report}");
}
