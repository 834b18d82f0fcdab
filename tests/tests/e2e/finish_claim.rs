//! `POST /v1/finish` with a `claim`: the claim sees what the items changed,
//! no lease of it is answered before they are committed, and the answer
//! carries both.

use runlease_protocol::JobState;
use runlease_protocol::worker::Lease;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

fn leases(body: &Value) -> Vec<Lease> {
    serde_json::from_value(body["leases"].clone()).unwrap()
}

#[tokio::test]
async fn a_job_released_by_an_item_comes_back_in_the_claim_of_the_same_request() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("q", json!("only job")).await;
    let first = c.api.claim_one("q", "w").await;

    // The only job of the queue is running: the claim can hand it out only
    // if the release before it was committed first.
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({
                "items": [{"lease_token": first.lease_token, "action": "release", "progress": {"page": 2}}],
                "claim": {"queues": ["q"], "worker_id": "w", "max_jobs": 4, "wait_ms": 0},
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["items"][0]["status"], "ok", "{body}");
    assert_eq!(body["items"][0]["state"], "queued", "{body}");
    let next = leases(&body);
    assert_eq!(next.len(), 1, "{body}");
    assert_eq!(next[0].job_id, job.id);
    assert_eq!(next[0].run_lease.0, first.run_lease.0 + 1);
    assert_eq!(
        next[0].progress,
        Some(json!({"page": 2})),
        "the checkpoint the release saved"
    );

    // The new lease is live and works like any other.
    assert_eq!(c.api.heartbeat(&next[0]).await, "renewed");
    let (status, body) = c.api.complete(&next[0], json!("done")).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_worker_loop_is_one_request_per_cycle() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs: Vec<Value> = (0..20).map(|i| json!({"queue": "loop", "payload": i})).collect();
    let (status, body) = c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await;
    assert_eq!(status, 201, "{body}");

    // The first cycle has nothing to finish: no items, only the claim.
    let claim = json!({"queues": ["loop"], "worker_id": "looper", "max_jobs": 3, "wait_ms": 0});
    let (status, body) = c.api.post("/v1/finish", &json!({"claim": claim})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["items"], json!([]));
    let mut held = leases(&body);
    let mut requests = 1;
    let mut done = 0;
    while !held.is_empty() {
        let items: Vec<Value> = held
            .iter()
            .map(|l| json!({"lease_token": l.lease_token, "action": "complete", "result": l.payload}))
            .collect();
        let (status, body) = c
            .api
            .post("/v1/finish", &json!({"items": items, "claim": claim}))
            .await;
        requests += 1;
        assert_eq!(status, 200, "{body}");
        for item in body["items"].as_array().unwrap() {
            assert_eq!(item["status"], "ok", "{body}");
            assert_eq!(item["state"], "done", "{body}");
            done += 1;
        }
        held = leases(&body);
    }
    assert_eq!(done, 20);
    // 20 jobs, 3 per cycle: 7 cycles to hand them out and finish the last,
    // plus the first pure claim.
    assert_eq!(requests, 8);
    let (_, figures) = c.api.get("/v1/queues/loop").await;
    assert_eq!(figures["counts"]["done"], 20, "{figures}");

    // Without a claim the answer has no leases field at all.
    let job = c.api.enqueue("loop", json!("last")).await;
    let lease = c.api.claim_one("loop", "looper").await;
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({"items": [{"lease_token": lease.lease_token, "action": "complete"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("leases").is_none(), "{body}");
    assert_eq!(c.api.job(job.id).await.state, JobState::Done);
}

#[tokio::test]
async fn completes_with_a_claim_answer_every_item_and_hand_out_only_claimable_jobs() {
    // A batch of completes with a claim: the answer holds every item (a
    // repeat of an applied complete included) and only jobs that were
    // claimable; the tallies count each job once.
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(c.api.enqueue("q", json!(i)).await.id);
    }
    let held = c.api.claim("q", "w", 3).await;
    assert_eq!(held.iter().map(|l| l.job_id).collect::<Vec<_>>(), ids[..3]);
    let (status, body) = c.api.complete(&held[0], json!("first")).await;
    assert_eq!(status, 200, "{body}");

    let items: Vec<Value> = held
        .iter()
        .map(|l| json!({"lease_token": l.lease_token, "action": "complete", "result": l.payload}))
        .collect();
    let claim = json!({"queues": ["q"], "worker_id": "w", "max_jobs": 4, "wait_ms": 0});
    let (status, body) = c
        .api
        .post("/v1/finish", &json!({"items": items, "claim": claim}))
        .await;
    assert_eq!(status, 200, "{body}");
    for (i, item) in body["items"].as_array().unwrap().iter().enumerate() {
        assert_eq!(item["status"], "ok", "item {i}: {body}");
        assert_eq!(item["state"], "done", "item {i}: {body}");
    }
    let next = leases(&body);
    assert_eq!(next.len(), 1, "{body}");
    assert_eq!(next[0].job_id, ids[3]);
    assert_eq!(next[0].run_lease.0, 1);
    assert_eq!(next[0].payload, json!(3));
    // The repeat kept the first complete's result.
    assert_eq!(c.api.job(ids[0]).await.result, Some(json!("first")));
    assert_eq!(c.api.job(ids[1]).await.state, JobState::Done);
    let (_, figures) = c.api.get("/v1/queues/q").await;
    assert_eq!(figures["counts"]["done"], 3, "{figures}");
    assert_eq!(figures["counts"]["running"], 1, "{figures}");
}

#[tokio::test]
async fn a_bad_claim_refuses_the_whole_request_before_any_item_is_written() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w").await;
    let item = json!({"lease_token": lease.lease_token, "action": "complete", "result": "early"});
    for (claim, why) in [
        (json!({"queues": [], "worker_id": "w"}), "no queue"),
        (
            json!({"queues": ["q"], "worker_id": "w", "max_jobs": 0}),
            "max_jobs 0",
        ),
        (
            json!({"queues": ["q"], "worker_id": "w", "wait_ms": 60001}),
            "wait_ms too long",
        ),
    ] {
        let (status, body) = c
            .api
            .post("/v1/finish", &json!({"items": [item], "claim": claim}))
            .await;
        assert_eq!(status, 422, "{why}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().starts_with("claim: "),
            "{why}: {body}"
        );
        let now = c.api.job(job.id).await;
        assert_eq!(now.state, JobState::Running, "{why}: the item was not written");
        assert_eq!(now.result, None);
    }
    // Neither items nor a claim: nothing to do, 422.
    let (status, body) = c.api.post("/v1/finish", &json!({"items": []})).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = c.api.post("/v1/finish", &json!({})).await;
    assert_eq!(status, 422, "{body}");
}

#[tokio::test]
async fn the_claim_of_a_finish_long_polls_and_is_woken_by_an_enqueue() {
    let db = TestDb::new().await;
    // A re-check far longer than the test: only a wake-up can answer in time.
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.leases.claim_recheck = std::time::Duration::from_millis(60_000)
    })
    .await;
    c.api.enqueue("q", json!(1)).await;
    let lease = c.api.claim_one("q", "w").await;
    let api = c.api.clone();
    let token = lease.lease_token.clone();
    let started = std::time::Instant::now();
    let parked = tokio::spawn(async move {
        api.post(
            "/v1/finish",
            &json!({
                "items": [{"lease_token": token, "action": "complete"}],
                "claim": {"queues": ["q"], "worker_id": "w", "max_jobs": 1, "wait_ms": 30_000},
            }),
        )
        .await
    });
    // The item is committed before the claim parks.
    runlease_tests::api::until(&c.api, lease.job_id, "the item is done", |j| {
        j.state == JobState::Done
    })
    .await;
    let later = c.api.enqueue("q", json!(2)).await;
    let (status, body) = parked.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["items"][0]["status"], "ok", "{body}");
    let got = leases(&body);
    assert_eq!(got.len(), 1, "{body}");
    assert_eq!(got[0].job_id, later.id);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "answered by the wake-up, not a timer: {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn workers_whose_claims_ride_their_finishes_drain_every_job_exactly_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs: Vec<Value> = (0..600).map(|i| json!({"queue": "ride", "payload": i})).collect();
    let (status, body) = c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await;
    assert_eq!(status, 201, "{body}");

    // 24 workers at once, each claiming on the back of its finishes (the
    // first request a pure claim) until a claim hands it nothing: their
    // claims share transactions with other workers' finishes.
    let workers = (0..24).map(|w| {
        let api = c.api.clone();
        tokio::spawn(async move {
            let claim =
                json!({"queues": ["ride"], "worker_id": format!("w{w}"), "max_jobs": 4, "wait_ms": 0});
            let mut held: Vec<Lease> = Vec::new();
            let mut finished = Vec::new();
            loop {
                let items: Vec<Value> = held
                    .iter()
                    .map(|l| json!({"lease_token": l.lease_token, "action": "complete", "result": l.payload}))
                    .collect();
                let (status, body) = api
                    .post("/v1/finish", &json!({"items": items, "claim": claim}))
                    .await;
                assert_eq!(status, 200, "{body}");
                for (item, lease) in body["items"].as_array().unwrap().iter().zip(&held) {
                    assert_eq!(item["status"], "ok", "{body}");
                    assert_eq!(item["state"], "done", "{body}");
                    finished.push(lease.job_id);
                }
                held = leases(&body);
                if held.is_empty() {
                    return finished;
                }
            }
        })
    });
    let mut finished = Vec::new();
    for w in workers {
        finished.extend(w.await.unwrap());
    }
    let distinct: std::collections::HashSet<_> = finished.iter().collect();
    assert_eq!(finished.len(), 600, "every job finished by one worker");
    assert_eq!(distinct.len(), 600, "no job handed out twice");
    let (_, figures) = c.api.get("/v1/queues/ride").await;
    assert_eq!(figures["counts"]["done"], 600, "{figures}");
    // Each job had one attempt under one lease.
    let client = db.client().await;
    let row = client
        .query_one(
            "SELECT count(*) FILTER (WHERE run_lease <> 1 OR attempt <> 1) AS odd, count(*) AS n FROM jobs WHERE queue = 'ride'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>("n"), 600);
    assert_eq!(row.get::<_, i64>("odd"), 0);
}

#[tokio::test]
async fn the_claim_of_a_finish_sees_what_its_items_set_off() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let (status, body) = c
        .api
        .patch("/v1/queues/work", &json!({"dead_letter_queue": "dead"}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = c
        .api
        .post(
            "/v1/jobs/batch",
            &json!({"jobs": [
                {"queue": "work", "payload": "first", "ref": "a"},
                {"queue": "work", "payload": "then", "depends_on": ["a"]},
                {"queue": "work", "payload": "doomed", "max_attempts": 1},
            ]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let ids: Vec<&str> = (0..3).map(|i| body["jobs"][i]["id"].as_str().unwrap()).collect();
    let first = c.api.claim_one("work", "w").await;
    let doomed = c.api.claim_one("work", "w").await;
    assert_eq!(
        (first.job_id.0.to_string(), doomed.job_id.0.to_string()),
        (ids[0].to_owned(), ids[2].to_owned())
    );

    // Nothing else is claimable: the claim can hand out the dependent and
    // the dead-letter follow-up only if it sees what the items set off.
    let (status, body) = c
        .api
        .post(
            "/v1/finish",
            &json!({
                "items": [
                    {"lease_token": first.lease_token, "action": "complete", "result": {"ok": 1}},
                    {"lease_token": doomed.lease_token, "action": "fail", "error": "broken", "retryable": false},
                ],
                "claim": {"queues": ["work", "dead"], "worker_id": "w", "max_jobs": 4, "wait_ms": 0},
            }),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let states: Vec<&str> = (0..2)
        .map(|i| body["items"][i]["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["done", "failed"], "{body}");
    let mut next = leases(&body);
    next.sort_by_key(|l| l.payload != json!("then"));
    assert_eq!(next.len(), 2, "{body}");
    assert_eq!(next[0].job_id.0.to_string(), ids[1], "the dependent: {body}");
    assert_eq!(next[0].dependencies.len(), 1, "{body}");
    assert_eq!(next[0].dependencies[0].result, Some(json!({"ok": 1})), "{body}");
    assert_eq!(next[1].payload["job_id"], ids[2], "the follow-up: {body}");
    assert_eq!(next[1].payload["error"], "broken", "{body}");
}
