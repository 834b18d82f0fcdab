//! `rediss://` Redis URLs: two coordinator processes whose only Redis is a
//! TLS-only `redis-server` (a certificate authority and a server
//! certificate this test makes with `openssl`), trusting that authority
//! through `SSL_CERT_FILE`, carry a wake-up from one to the other.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runlease_tests::process::free_port;
use runlease_tests::{CoordinatorProcess, TestDb};
use serde_json::json;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run openssl (is it installed?): {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A certificate authority and a certificate for 127.0.0.1 signed by it.
fn make_certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=runlease test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
}

/// A redis-server listening with TLS only.
struct TlsRedis {
    port: u16,
    child: Child,
}

impl TlsRedis {
    async fn start(dir: &Path) -> Self {
        let port = free_port();
        let mut child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
            ])
            .args(["--tls-cert-file", "server.pem", "--tls-key-file", "server.key"])
            .args(["--tls-ca-cert-file", "ca.pem", "--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start redis-server (is it installed?): {e}"));
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Self { port, child };
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("the TLS redis-server did not start on port {port} (built without TLS support?)");
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn coordinators_signal_each_other_through_a_tls_redis() {
    let dir = std::env::temp_dir().join(format!("runlease-redis-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    make_certificates(&dir);
    let redis = TlsRedis::start(&dir).await;
    let db = TestDb::new().await;
    let env = [
        ("RUNLEASE_REDIS_URL", format!("rediss://127.0.0.1:{}", redis.port)),
        ("SSL_CERT_FILE", dir.join("ca.pem").display().to_string()),
        // Without a wake-up, a parked claim would look again only after a minute.
        ("RUNLEASE_CLAIM_RECHECK_MS", "60000".to_owned()),
    ];
    let a = CoordinatorProcess::start(&db, &env).await;
    let b = CoordinatorProcess::start(&db, &env).await;
    for c in [&a, &b] {
        let (status, ready) = c.api.get("/readyz").await;
        assert_eq!(status, 200);
        // Subscribed over TLS (the status is "degraded" until the link is up).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut ready = ready;
        while ready["redis"] != "ok" && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            ready = c.api.get("/readyz").await.1;
        }
        assert_eq!(ready["redis"], "ok", "{ready}");
    }

    let parked = {
        let api = b.api.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let (status, body) = api
                .post(
                    "/v1/claim",
                    &json!({"queues": ["tls"], "worker_id": "w", "wait_ms": 30000}),
                )
                .await;
            (status, body, started.elapsed())
        })
    };
    // The claim is parked on B before the enqueue on A.
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.api.metric("runlease_claim_waiters").await < 1.0 {
        assert!(Instant::now() < deadline, "the claim never parked on B");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let job = a.api.enqueue("tls", json!({"over": "tls"})).await;
    let (status, body, waited) = parked.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"][0]["job_id"], json!(job.id), "{body}");
    assert!(
        waited < Duration::from_secs(20),
        "B's claim was answered after {waited:?}: the wake-up did not come through Redis"
    );
    assert_eq!(a.api.metric("runlease_redis_publish_failures_total").await, 0.0);
    drop(a);
    drop(b);
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}
