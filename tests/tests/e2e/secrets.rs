//! Keys and secrets: several lease-token keys (the first signs, all verify)
//! rotate without refusing running leases; a token under a key no longer
//! listed is refused; secrets can come from files (`*_FILE`); a key shorter
//! than 32 bytes is refused at start; neither `--help` nor `/readyz` shows
//! a password or PostgreSQL's error text.

use std::process::{Output, Stdio};
use std::time::Duration;

use runlease_tests::process::coordinator_binary;
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;

const KEY_A: &str = "key-a-00000000000000000000000000";
const KEY_B: &str = "key-b-00000000000000000000000000";

#[tokio::test]
async fn a_lease_token_key_rotates_without_refusing_running_leases() {
    let db = TestDb::new().await;
    let a = TestCoordinator::start_with(&db, |cfg| cfg.keys.secret = Some(KEY_A.into())).await;
    let job = a.api.enqueue("q", json!(1)).await;
    let under_a = a.api.claim_one("q", "w").await;
    a.stop().await.unwrap();

    // B signs from now on; A still verifies: the running lease finishes.
    let b = TestCoordinator::start_with(&db, |cfg| cfg.keys.secret = Some(format!("{KEY_B}, {KEY_A}"))).await;
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
    let c = TestCoordinator::start_with(&db, |cfg| cfg.keys.secret = Some(KEY_B.into())).await;
    assert_eq!(
        c.api.complete(&under_b, json!("ok")).await.0,
        200,
        "signed with B"
    );
    let other = TestDb::new().await;
    let d = TestCoordinator::start_with(&other, |cfg| cfg.keys.secret = Some(KEY_A.into())).await;
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
    std::fs::write(&secret, "secret-from-a-file-0000000000000\n").unwrap();
    std::fs::write(&keys, "admin:admin-key-from-file-0001\n").unwrap();
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.secret = None;
        cfg.keys.secret_file = Some(secret.clone());
        cfg.keys.api_keys = None;
        cfg.keys.api_keys_file = Some(keys.clone());
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
        cfg.keys.secret = Some("secret-from-a-file-0000000000000".into());
        cfg.keys.api_keys = Some("admin:admin-key-from-file-0001".into());
    })
    .await;
    let admin = again.api.with_key("admin-key-from-file-0001");
    assert_eq!(admin.complete(&lease, json!("ok")).await.0, 200);
    assert_eq!(admin.job(job.id).await.state, runlease_protocol::JobState::Done);
    // Both ways at once is refused at start.
    let mut cfg = runlease_tests::test_config(&db.url);
    cfg.keys.secret = Some("a-value".into());
    cfg.keys.secret_file = Some(secret.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let err = runlease_coordinator::serve(cfg, listener, tokio_util::sync::CancellationToken::new())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not both"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Runs the coordinator binary with `args` and `env` (no other `RUNLEASE_*`
/// secret from the test's environment), its output captured; a process
/// still running after 30 s fails the test.
async fn coordinator_output(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(coordinator_binary());
    cmd.args(args)
        .env_remove("RUNLEASE_SECRET_FILE")
        .env_remove("RUNLEASE_API_KEYS")
        .env_remove("RUNLEASE_API_KEYS_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (name, value) in env {
        cmd.env(name, value);
    }
    let child = cmd.spawn().unwrap();
    tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("runlease-coordinator {args:?} was still running after 30 s"))
        .unwrap()
}

#[tokio::test]
async fn an_8_byte_secret_is_refused_at_start() {
    let db = TestDb::new().await;
    let out = coordinator_output(
        &["serve"],
        &[
            ("RUNLEASE_DATABASE_URL", &db.url),
            ("RUNLEASE_LISTEN", "127.0.0.1:0"),
            ("RUNLEASE_REDIS_URL", ""),
            ("RUNLEASE_SECRET", "8-bytes!"),
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with an 8-byte secret: {stderr}");
    assert!(
        stderr.contains("RUNLEASE_SECRET is 8 bytes") && stderr.contains("at least 32 bytes"),
        "the refusal does not name the rule: {stderr}"
    );
    assert!(
        stderr.contains("openssl rand"),
        "the refusal does not say how to make one: {stderr}"
    );
    assert!(
        !stderr.contains("8-bytes!"),
        "the refusal quotes the secret: {stderr}"
    );
}

#[tokio::test]
async fn a_secret_split_by_a_comma_into_a_short_key_is_refused() {
    let db = TestDb::new().await;
    let mut cfg = runlease_tests::test_config(&db.url);
    // 42 bytes, but the comma makes it two keys, the second of 4 bytes.
    cfg.keys.secret = Some("a-passphrase-long-enough-to-sign-with,xyz!".into());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let serve = runlease_coordinator::serve(cfg, listener, tokio_util::sync::CancellationToken::new());
    let err = tokio::time::timeout(Duration::from_secs(30), serve)
        .await
        .expect("the coordinator started with a 4-byte key")
        .unwrap_err();
    assert!(matches!(err, runlease_coordinator::Error::Config(_)), "{err:?}");
    let err = err.to_string();
    assert!(
        err.contains("key 2 of 2 is 4 bytes") && err.contains("at least 32 bytes"),
        "{err}"
    );
    assert!(
        err.contains("split at commas") && err.contains("a secret with a comma in it"),
        "{err}"
    );
    assert!(
        !err.contains("xyz!") && !err.contains("passphrase"),
        "the refusal quotes a key: {err}"
    );
}

#[tokio::test]
async fn help_lists_the_variables_but_no_value_from_the_environment() {
    let env = [
        ("RUNLEASE_DATABASE_URL", "postgres://u:hunter2-secret@h/db"),
        ("RUNLEASE_REDIS_URL", "redis://:pw-secret@h"),
        ("RUNLEASE_SECRET", "lease-secret-0123456789abcdef0123456789"),
        ("RUNLEASE_API_KEYS", "admin:api-key-secret-0123456789"),
        ("RUNLEASE_SQS_ENDPOINT", "http://sqs-user:sqs-pw-secret@h"),
    ];
    for args in [&["--help"][..], &["-h"], &["help"], &["serve", "--help"]] {
        let out = coordinator_output(args, &env).await;
        assert!(out.status.success(), "runlease-coordinator {args:?}: {out:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        for (name, value) in env {
            assert!(!help.contains(value), "{args:?} shows {name}'s value:\n{help}");
        }
        for secret in ["hunter2-secret", "pw-secret", "lease-secret", "api-key-secret"] {
            assert!(!help.contains(secret), "{args:?} shows {secret:?}:\n{help}");
        }
        if args == ["--help"] {
            for (name, _) in env {
                assert!(
                    help.contains(&format!("[env: {name}]")),
                    "--help no longer names {name}:\n{help}"
                );
            }
        }
    }

    // The `runlease` CLI's URL may carry a password too.
    for args in [&["--help"][..], &["enqueue", "--help"]] {
        let out = std::process::Command::new(runlease_tests::cli::cli_binary())
            .args(args)
            .env("RUNLEASE_URL", "https://u:url-pw-secret@runlease.example.com")
            .env("RUNLEASE_KEY", "cli-key-secret-0123456789")
            .output()
            .unwrap();
        assert!(out.status.success(), "runlease {args:?}: {out:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(
            !help.contains("url-pw-secret") && !help.contains("cli-key-secret"),
            "runlease {args:?} shows a value from the environment:\n{help}"
        );
        assert!(
            help.contains("[env: RUNLEASE_URL]") && help.contains("[env: RUNLEASE_KEY]"),
            "{help}"
        );
    }
}

#[tokio::test]
async fn readyz_does_not_repeat_postgresql_error_text() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    assert_eq!(c.api.get("/readyz").await.0, 200);
    let admin = runlease_tests::admin().await;
    let name = db.name.replace('"', "\"\"");
    // PostgreSQL now refuses the coordinator's connections with a message
    // of its own, naming the database.
    admin
        .batch_execute(&format!(
            r#"ALTER DATABASE "{name}" ALLOW_CONNECTIONS false;
               SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}'"#,
            db.name.replace('\'', "''")
        ))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let body = loop {
        let (status, body) = c.api.get("/readyz").await;
        if status == 503 {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/readyz stayed {status}: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(body["error"]["code"], json!("overloaded"), "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default().to_owned();
    assert!(!message.is_empty(), "{body}");
    for leak in [
        "accepting connections",
        "SQLSTATE",
        "FATAL",
        "db error",
        db.name.as_str(),
    ] {
        assert!(
            !body.to_string().contains(leak),
            "/readyz repeats {leak:?}: {body}"
        );
    }

    admin
        .batch_execute(&format!(r#"ALTER DATABASE "{name}" ALLOW_CONNECTIONS true"#))
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while c.api.get("/readyz").await.0 != 200 {
        assert!(std::time::Instant::now() < deadline, "/readyz did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
