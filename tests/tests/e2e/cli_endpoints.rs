//! The `runlease` CLI's endpoint verbs against a real coordinator and a
//! real HTTP endpoint on 127.0.0.1 (allowed by
//! `RUNLEASE_ENDPOINT_ALLOW_HOSTS`): `queues set-endpoint` serves a queue
//! by it, `queues show` and `queues` show its URL, health, requests in
//! flight and last error, `endpoint-secret` prints the secret alone,
//! `rotate-endpoint-secret` makes a new one with the old one still
//! signing, `remove-endpoint` stops the pushes; bad values are refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use runlease_protocol::JobState;
use runlease_protocol::admin::EndpointSecretResponse;
use runlease_protocol::producer::QueueSummary;
use runlease_tests::api::until;
use runlease_tests::cli::{ok, refused, runlease, stderr};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const QUEUE: &str = "hooks";

/// An endpoint on 127.0.0.1 (for this module and the dashboard's tests) that holds every request open until `release`
/// is set, then answers `500 kaput`; it counts the requests it received.
pub struct HeldEndpoint {
    addr: SocketAddr,
    /// Set to true: every held request (and every later one) is answered.
    pub release: watch::Sender<bool>,
    /// Requests received so far.
    pub received: Arc<AtomicUsize>,
}

impl HeldEndpoint {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (release, gate) = watch::channel(false);
        let received = Arc::new(AtomicUsize::new(0));
        let count = received.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (gate, count) = (gate.clone(), count.clone());
                tokio::spawn(answer_when_released(stream, gate, count));
            }
        });
        Self {
            addr,
            release,
            received,
        }
    }

    /// `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.addr.port())
    }
}

/// Reads one request (head and `content-length` body), waits for the gate,
/// answers 500 with the body `kaput`.
async fn answer_when_released(
    mut stream: TcpStream,
    mut gate: watch::Receiver<bool>,
    count: Arc<AtomicUsize>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let body_start = loop {
        let Ok(n) = stream.read(&mut chunk).await else {
            return;
        };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..body_start]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().unwrap_or(0));
    while buf.len() < body_start + length {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    count.fetch_add(1, Ordering::SeqCst);
    if gate.wait_for(|open| *open).await.is_err() {
        return;
    }
    let _ = stream
        .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\ncontent-length: 5\r\nconnection: close\r\n\r\nkaput")
        .await;
}

/// The words after `name` on the row of `queues show` that starts with it.
fn row(show: &str, name: &str) -> String {
    let line = show
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} row:\n{show}"));
    line[name.len()..].trim().to_owned()
}

async fn show(url: &str) -> String {
    ok(&runlease(url, &["queues", "show", QUEUE], None).await)
}

/// Runs `queues show` until `pred` holds of its output (20 s at most).
async fn show_until(url: &str, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let started = std::time::Instant::now();
    loop {
        let out = show(url).await;
        if pred(&out) {
            return out;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what}: still not so after 20 s:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn cli_set_endpoint_shows_it_in_flight_and_its_last_error_and_removes_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.endpoints.allow_hosts = Some("127.0.0.1".to_owned());
    })
    .await;
    let url = c.api.base().to_owned();
    let endpoint = HeldEndpoint::start().await;

    // No endpoint yet: show says so; the list has an empty endpoint column.
    c.api.enqueue("pulled", json!(1)).await;
    assert_eq!(row(&show(&url).await, "endpoint"), "none (pull workers only)");

    let out = ok(&runlease(
        &url,
        &[
            "queues",
            "set-endpoint",
            QUEUE,
            &endpoint.url(),
            "--timeout-ms",
            "30000",
            "--concurrency",
            "3",
        ],
        None,
    )
    .await);
    assert!(
        out.contains(&endpoint.url()) && out.contains("timeout 30000 ms") && out.contains("concurrency 3"),
        "{out}"
    );
    let out = ok(&runlease(&url, &["--json", "queues", "show", QUEUE], None).await);
    let summary: QueueSummary = serde_json::from_str(&out).unwrap();
    let figures = summary.endpoint.expect("the queue has its endpoint");
    assert_eq!(
        (figures.url.as_str(), figures.timeout_ms, figures.concurrency),
        (endpoint.url().as_str(), 30_000, 3)
    );

    // A job is pushed and held open: in flight 1, healthy.
    let job = c.api.enqueue_attempts(QUEUE, json!({"n": 1}), 1).await;
    let out = show_until(&url, "the push is in flight", |s| {
        row(s, "endpoint_in_flight") == "1"
    })
    .await;
    assert_eq!(row(&out, "endpoint"), endpoint.url());
    assert_eq!(row(&out, "endpoint_timeout"), "30000 ms");
    assert_eq!(row(&out, "endpoint_concurrency"), "3");
    assert_eq!(row(&out, "endpoint_health"), "healthy");
    assert_eq!(row(&out, "endpoint_last_error"), "-");
    assert_eq!(endpoint.received.load(Ordering::SeqCst), 1);
    let list = ok(&runlease(&url, &["queues"], None).await);
    let header = list.lines().next().unwrap();
    assert!(
        header.contains("health") && header.contains("in_flight") && header.contains("endpoint"),
        "{header}"
    );
    let line = list
        .lines()
        .find(|l| l.starts_with(QUEUE))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        line.contains("healthy") && line.contains("1/3") && line.contains(&endpoint.url()),
        "{line}"
    );
    let pulled = list
        .lines()
        .find(|l| l.starts_with("pulled"))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(pulled.trim_end().ends_with('-'), "no endpoint: {pulled}");

    // It answers 500: the job fails (its only attempt); the error is shown.
    endpoint.release.send(true).unwrap();
    let failed = until(&c.api, job.id, "the 500 is applied", |j| {
        j.state == JobState::Failed
    })
    .await;
    assert!(
        failed.error.as_deref().unwrap_or("").contains("kaput"),
        "{failed:?}"
    );
    let out = show_until(&url, "the last error is shown", |s| {
        row(s, "endpoint_last_error").contains("kaput")
    })
    .await;
    assert!(row(&out, "endpoint_last_error").contains("500"), "{out}");
    let list = ok(&runlease(&url, &["queues"], None).await);
    let line = list.lines().find(|l| l.starts_with(QUEUE)).unwrap();
    assert!(line.contains("last error: ") && line.contains("kaput"), "{line}");

    // Removed: show says so, and nothing more is pushed.
    let out = ok(&runlease(&url, &["queues", "remove-endpoint", QUEUE], None).await);
    assert!(out.contains("none"), "{out}");
    let out = ok(&runlease(&url, &["--json", "queues", "show", QUEUE], None).await);
    let summary: QueueSummary = serde_json::from_str(&out).unwrap();
    assert!(summary.endpoint.is_none(), "{out}");
    assert_eq!(row(&show(&url).await, "endpoint"), "none (pull workers only)");
    let later = c.api.enqueue(QUEUE, json!({"n": 2})).await;
    let leases = c.api.claim_wait(QUEUE, "w", 1, 10_000).await;
    assert_eq!(leases.len(), 1, "a pull claim gets the job");
    assert_eq!(leases[0].job_id, later.id);
    assert_eq!(endpoint.received.load(Ordering::SeqCst), 1, "one push in all");
}

#[tokio::test]
async fn cli_endpoint_secret_prints_it_alone_and_a_rotation_keeps_the_old_one_signing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.endpoints.allow_hosts = Some("127.0.0.1".to_owned());
    })
    .await;
    let url = c.api.base().to_owned();
    ok(&runlease(
        &url,
        &["queues", "set-endpoint", QUEUE, "http://127.0.0.1:9/"],
        None,
    )
    .await);

    let out = runlease(&url, &["queues", "endpoint-secret", QUEUE], None).await;
    let first = ok(&out).trim().to_owned();
    assert!(
        first.starts_with("whsec_") && !first.contains(char::is_whitespace),
        "{first}"
    );
    assert_eq!(stderr(&out), "", "nothing else while no rotation runs");
    let out = ok(&runlease(&url, &["--json", "queues", "endpoint-secret", QUEUE], None).await);
    let answer: EndpointSecretResponse = serde_json::from_str(&out).unwrap();
    assert_eq!(answer.secret, first);
    assert_eq!(answer.previous_secret, None);

    let out = runlease(&url, &["queues", "rotate-endpoint-secret", QUEUE], None).await;
    let second = ok(&out).trim().to_owned();
    assert!(second.starts_with("whsec_") && second != first, "{second}");
    assert!(
        stderr(&out).contains("previous one signs beside it until"),
        "{}",
        stderr(&out)
    );
    let out = runlease(&url, &["queues", "endpoint-secret", QUEUE], None).await;
    assert_eq!(ok(&out).trim(), second);
    assert!(
        stderr(&out).contains("previous secret also signs until"),
        "{}",
        stderr(&out)
    );
    let out = ok(&runlease(&url, &["--json", "queues", "endpoint-secret", QUEUE], None).await);
    let answer: EndpointSecretResponse = serde_json::from_str(&out).unwrap();
    assert_eq!(answer.secret, second);
    assert_eq!(answer.previous_secret.as_deref(), Some(first.as_str()));
    assert!(answer.previous_expires_at.is_some_and(|t| t > chrono::Utc::now()));
}

#[tokio::test]
async fn cli_set_endpoint_refuses_bad_values() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    // Refused here, before anything is sent.
    for args in [
        ["--concurrency", "0"],
        ["--concurrency", "1001"],
        ["--timeout-ms", "999"],
        ["--timeout-ms", "900001"],
    ] {
        let mut line = vec!["queues", "set-endpoint", QUEUE, "https://example.com/"];
        line.extend(args);
        let err = refused(&runlease(&url, &line, None).await);
        assert!(err.contains(args[0]), "{args:?}: {err}");
    }
    // Refused by the coordinator: not https, and a loopback address not allowed.
    for bad in ["ftp://example.com/", "http://127.0.0.1:9/"] {
        let out = runlease(&url, &["--json", "queues", "set-endpoint", QUEUE, bad], None).await;
        assert_eq!(out.status.code(), Some(1), "{bad}");
        let err: serde_json::Value = serde_json::from_str(stderr(&out).trim()).unwrap();
        assert_eq!(err["error"]["code"], "invalid", "{bad}: {err}");
    }
    let out = ok(&runlease(&url, &["--json", "queues", "show", QUEUE], None).await);
    let summary: QueueSummary = serde_json::from_str(&out).unwrap();
    assert!(summary.endpoint.is_none(), "nothing was set: {out}");
    // No endpoint was ever set: there is no secret to read.
    let err = refused(&runlease(&url, &["queues", "endpoint-secret", QUEUE], None).await);
    assert!(err.starts_with("runlease: "), "{err}");
}
