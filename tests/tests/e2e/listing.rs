//! Listing a queue's jobs: newest first, keyset pages that neither repeat
//! nor skip a job while new ones arrive, filtered by state.

use std::collections::HashSet;

use runlease_protocol::admin::ListJobsResponse;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

async fn page(api: &runlease_tests::Api, query: &str) -> ListJobsResponse {
    let (status, body) = api.get(&format!("/v1/jobs?{query}")).await;
    assert_eq!(status, 200, "GET /v1/jobs?{query}: {body}");
    serde_json::from_value(body).unwrap()
}

#[tokio::test]
async fn pages_never_repeat_or_skip_an_older_job_while_jobs_are_enqueued() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut older = Vec::new();
    for i in 0..120 {
        older.push(c.api.enqueue("q", json!(i)).await.id);
    }
    let producer = {
        let api = c.api.clone();
        tokio::spawn(async move {
            for i in 0..200 {
                api.enqueue("q", json!({"late": i})).await;
            }
        })
    };
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let query = match &cursor {
            Some(c) => format!("queue=q&limit=7&cursor={c}"),
            None => "queue=q&limit=7".to_owned(),
        };
        let page = page(&c.api, &query).await;
        assert!(page.jobs.len() <= 7);
        seen.extend(page.jobs.iter().map(|j| j.0.id));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    producer.await.unwrap();
    let unique: HashSet<_> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no job appears twice");
    assert!(seen.windows(2).all(|w| w[0].0 > w[1].0), "newest first, strictly");
    for id in &older {
        assert!(
            unique.contains(id),
            "job {id}, older than the first page, was not skipped"
        );
    }
}

#[tokio::test]
async fn a_listing_filters_by_state_and_omits_the_chronology() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for i in 0..5 {
        c.api.enqueue("q", json!(i)).await;
    }
    c.api.enqueue("other", json!("x")).await;
    let leases = c.api.claim("q", "w", 2).await;
    assert_eq!(c.api.complete(&leases[0], json!("r")).await.0, 200);
    let (_, failed) = c.api.fail(&leases[1], "boom", false, None).await;
    assert_eq!(failed["state"], json!("failed"));

    let all = page(&c.api, "queue=q").await;
    assert_eq!(all.jobs.len(), 5);
    assert!(all.next_cursor.is_none());
    let (_, raw) = c.api.get("/v1/jobs?queue=q").await;
    assert!(
        raw["jobs"][0].get("attempts").is_none(),
        "listed jobs carry no chronology"
    );
    assert!(raw["jobs"][0].get("payload").is_some());

    let failed = page(&c.api, "queue=q&state=failed").await;
    assert_eq!(failed.jobs.len(), 1);
    assert_eq!(failed.jobs[0].0.id, leases[1].job_id);
    let finished = page(&c.api, "queue=q&state=done,failed").await;
    assert_eq!(finished.jobs.len(), 2);
    let queued = page(&c.api, "queue=q&state=queued").await;
    assert_eq!(queued.jobs.len(), 3);
    assert!(queued.jobs.iter().all(|j| j.0.queue.as_str() == "q"));
    assert!(page(&c.api, "queue=nothing-here").await.jobs.is_empty());
}

#[tokio::test]
async fn a_cursor_is_only_accepted_by_the_listing_that_issued_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for i in 0..3 {
        c.api.enqueue("q", json!(i)).await;
    }
    let first = page(&c.api, "queue=q&limit=1").await;
    let cursor = first.next_cursor.expect("a next page");
    let second = page(&c.api, &format!("queue=q&limit=1&cursor={cursor}")).await;
    assert_eq!(second.jobs.len(), 1);
    for query in [
        format!("queue=other&limit=1&cursor={cursor}"),
        format!("queue=q&state=done&limit=1&cursor={cursor}"),
        "queue=q&cursor=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".to_owned(),
        "queue=q&cursor=not-a-cursor".to_owned(),
    ] {
        let (status, body) = c.api.get(&format!("/v1/jobs?{query}")).await;
        assert_eq!(status, 422, "{query}: {body}");
        assert_eq!(body["error"]["code"], json!("invalid"));
    }
}
