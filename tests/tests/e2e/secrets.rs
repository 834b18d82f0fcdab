//! Keys and secrets: several lease-token keys (the first signs, all verify)
//! rotate without refusing running leases; a token under a key no longer
//! listed is refused; secrets can come from files (`*_FILE`).

use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_lease_token_key_rotates_without_refusing_running_leases() {
    let db = TestDb::new().await;
    let a = TestCoordinator::start_with(&db, |cfg| cfg.secret = Some("key-a-0000000000000000".into())).await;
    let job = a.api.enqueue("q", json!(1)).await;
    let under_a = a.api.claim_one("q", "w").await;
    a.stop().await.unwrap();

    // B signs from now on; A still verifies: the running lease finishes.
    let b = TestCoordinator::start_with(&db, |cfg| {
        cfg.secret = Some("key-b-0000000000000000, key-a-0000000000000000".into())
    })
    .await;
    let (status, body) = b.api.complete(&under_a, json!("done under a rotated key")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(b.api.job(job.id).await.state, runlease_protocol::JobState::Done);
    b.api.enqueue("q", json!(2)).await;
    let under_b = b.api.claim_one("q", "w").await;
    let stale = b.api.enqueue("q", json!(3)).await;
    let under_b_too = b.api.claim_one("q", "w").await;
    assert_eq!(under_b_too.job_id, stale.id);
    b.stop().await.unwrap();

    // A retired: B's tokens verify, a token under A (or any unknown key) does not.
    let c = TestCoordinator::start_with(&db, |cfg| cfg.secret = Some("key-b-0000000000000000".into())).await;
    assert_eq!(
        c.api.complete(&under_b, json!("ok")).await.0,
        200,
        "signed with B"
    );
    let other = TestDb::new().await;
    let d =
        TestCoordinator::start_with(&other, |cfg| cfg.secret = Some("key-a-0000000000000000".into())).await;
    d.api.enqueue("q", json!(4)).await;
    let foreign = d.api.claim_one("q", "w").await;
    let (status, body) = c.api.complete(&foreign, json!("nope")).await;
    assert_eq!(status, 409, "a token under a key no longer listed: {body}");
    assert_eq!(body["error"]["code"], json!("lease_lost"));
    assert_eq!(c.api.metric("runlease_forged_tokens_total").await, 1.0);
    assert_eq!(c.api.complete(&under_b_too, json!("ok")).await.0, 200);
}

#[tokio::test]
async fn secrets_and_keys_can_come_from_files() {
    let db = TestDb::new().await;
    let dir = std::env::temp_dir().join(format!("runlease-secrets-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("secret");
    let keys = dir.join("api_keys");
    std::fs::write(&secret, "secret-from-a-file-000000\n").unwrap();
    std::fs::write(&keys, "admin:admin-key-from-file-0001\n").unwrap();
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.secret = None;
        cfg.secret_file = Some(secret.clone());
        cfg.api_keys = None;
        cfg.api_keys_file = Some(keys.clone());
    })
    .await;
    assert_eq!(c.api.get("/v1/queues").await.0, 401, "keys are configured");
    let admin = c.api.with_key("admin-key-from-file-0001");
    assert_eq!(admin.get("/v1/queues").await.0, 200);
    let job = admin.enqueue("q", json!(1)).await;
    let lease = admin.claim_one("q", "w").await;
    c.stop().await.unwrap();
    // The same secret given as a value verifies the lease the file's signed.
    let again = TestCoordinator::start_with(&db, |cfg| {
        cfg.secret = Some("secret-from-a-file-000000".into());
        cfg.api_keys = Some("admin:admin-key-from-file-0001".into());
    })
    .await;
    let admin = again.api.with_key("admin-key-from-file-0001");
    assert_eq!(admin.complete(&lease, json!("ok")).await.0, 200);
    assert_eq!(admin.job(job.id).await.state, runlease_protocol::JobState::Done);
    // Both ways at once is refused at start.
    let mut cfg = runlease_tests::test_config(&db.url);
    cfg.secret = Some("a-value".into());
    cfg.secret_file = Some(secret.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = runlease_coordinator::serve(cfg, listener, tokio_util::sync::CancellationToken::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
