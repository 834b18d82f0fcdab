//! Bearer keys with roles and queue lists; no keys means loopback only.

use runlease_tests::{TestCoordinator, TestDb, test_config};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

const PRODUCER: &str = "producer-key-0123456789";
const WORKER: &str = "worker-key-0123456789";
const EMAILS_WORKER: &str = "emails-worker-key-0123456789";
const ADMIN: &str = "admin-key-0123456789";

#[tokio::test]
async fn keys_and_roles_decide_who_may_do_what() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.api_keys = Some(format!(
            "producer:{PRODUCER},worker:{WORKER},worker:{EMAILS_WORKER}:emails,admin:{ADMIN}"
        ));
    })
    .await;
    let anonymous = c.api.clone();
    let producer = c.api.with_key(PRODUCER);
    let worker = c.api.with_key(WORKER);
    let emails_worker = c.api.with_key(EMAILS_WORKER);
    let admin = c.api.with_key(ADMIN);
    let wrong = c.api.with_key("not-a-configured-key-at-all");

    let job = json!({"queue": "emails", "payload": 1});
    let (status, body) = anonymous.post("/v1/jobs", &job).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("unauthorized"))
    );
    assert_eq!(wrong.post("/v1/jobs", &job).await.0, 401);
    let (status, body) = worker.post("/v1/jobs", &job).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
    let (status, created) = producer.post("/v1/jobs", &job).await;
    assert_eq!(status, 201);
    let (status, other) = producer
        .post("/v1/jobs", &json!({"queue": "billing", "payload": 2}))
        .await;
    assert_eq!(status, 201);

    let claim = |q: &str| json!({"queues": [q], "worker_id": "w", "max_jobs": 1});
    assert_eq!(producer.post("/v1/claim", &claim("emails")).await.0, 403);
    assert_eq!(emails_worker.post("/v1/claim", &claim("billing")).await.0, 403);
    let (status, body) = emails_worker.post("/v1/claim", &claim("emails")).await;
    assert_eq!(status, 200);
    assert_eq!(body["leases"][0]["job_id"], created["id"]);
    // A queue-limited key does not see other queues' jobs.
    assert_eq!(
        emails_worker
            .get(&format!("/v1/jobs/{}", other["id"].as_str().unwrap()))
            .await
            .0,
        404
    );
    assert_eq!(
        worker
            .get(&format!("/v1/jobs/{}", other["id"].as_str().unwrap()))
            .await
            .0,
        200
    );

    // Only admins retry.
    let id = other["id"].as_str().unwrap();
    assert_eq!(
        producer
            .post(&format!("/v1/jobs/{id}/cancel"), &json!({}))
            .await
            .0,
        200
    );
    assert_eq!(
        producer.post(&format!("/v1/jobs/{id}/retry"), &json!({})).await.0,
        403
    );
    assert_eq!(
        admin.post(&format!("/v1/jobs/{id}/retry"), &json!({})).await.0,
        200
    );

    // Listing: admins and producers; bulk actions and queue settings: admins.
    assert_eq!(producer.get("/v1/jobs?queue=emails").await.0, 200);
    assert_eq!(admin.get("/v1/jobs?queue=emails").await.0, 200);
    assert_eq!(worker.get("/v1/jobs?queue=emails").await.0, 403);
    assert_eq!(emails_worker.get("/v1/jobs?queue=billing").await.0, 403);
    let bulk = json!({"action": "retry", "queue": "billing", "states": ["cancelled"]});
    let (status, body) = producer.post("/v1/jobs/bulk", &bulk).await;
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")));
    assert_eq!(anonymous.post("/v1/jobs/bulk", &bulk).await.0, 401);
    let pause = json!({"paused": true});
    assert_eq!(producer.patch("/v1/queues/billing", &pause).await.0, 403);
    assert_eq!(worker.patch("/v1/queues/billing", &pause).await.0, 403);
    assert_eq!(producer.get("/v1/queues/billing").await.0, 200);
    assert_eq!(emails_worker.get("/v1/queues/billing").await.0, 403);
    let (status, body) = admin.get("/v1/queues/billing").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["settings"]["paused"],
        json!(false),
        "refused changes changed nothing"
    );
    assert_eq!(admin.patch("/v1/queues/billing", &pause).await.0, 200);
    let (status, body) = admin.post("/v1/jobs/bulk", &bulk).await;
    assert_eq!(
        (status, body),
        (200, json!({"matched": 0, "changed": 0})),
        "the job was retried already"
    );

    // Operations endpoints stay open for probes and scrapers.
    assert_eq!(anonymous.get("/healthz").await.0, 200);
    assert_eq!(anonymous.get_text("/metrics").await.0, 200);
    let (status, body) = emails_worker.get("/v1/queues").await;
    assert_eq!(status, 200);
    assert_eq!(
        body["queues"].as_array().unwrap().len(),
        1,
        "only the key's queues: {body}"
    );
}

#[tokio::test]
async fn without_keys_the_coordinator_refuses_a_non_loopback_address() {
    let db = TestDb::new().await;
    let config = test_config(&db.url);
    let listener = TcpListener::bind("0.0.0.0:0").await.unwrap();
    let result = runlease_coordinator::serve(config, listener, CancellationToken::new()).await;
    let error = result.expect_err("must refuse to start").to_string();
    assert!(error.contains("RUNLEASE_API_KEYS"), "{error}");
}
