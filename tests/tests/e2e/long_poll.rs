//! Long-polls: parked claims wake on a local enqueue; parked reads wake on a
//! terminal state; both answer normally when their wait runs out. The wake-up
//! tests re-check PostgreSQL only every minute, so only a wake-up can answer
//! them in time.

use std::time::{Duration, Instant};

use runlease_protocol::JobState;
use runlease_tests::{SLOW_RECHECK_MS, TestCoordinator, TestDb, WOKEN_WITHIN};
use serde_json::json;

fn slow_recheck(cfg: &mut runlease_coordinator::config::Config) {
    cfg.leases.claim_recheck = std::time::Duration::from_millis(SLOW_RECHECK_MS);
}

#[tokio::test]
async fn a_parked_claim_wakes_on_a_local_enqueue() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, slow_recheck).await;
    let api = c.api.clone();
    let parked = tokio::spawn(async move {
        let leases = api.claim_wait("wake", "w", 1, 30_000).await;
        (leases, Instant::now())
    });
    // Parked: it has looked at the empty queue and waits.
    c.api.until_claims_parked(1).await;
    let enqueued_at = Instant::now();
    let job = c.api.enqueue("wake", json!("hello")).await;
    let (leases, answered_at) = parked.await.unwrap();
    assert_eq!(leases.len(), 1, "the parked claim got the job");
    assert_eq!(leases[0].job_id, job.id);
    let woken = answered_at - enqueued_at;
    assert!(
        woken < WOKEN_WITHIN,
        "woken by the enqueue, not by the re-check timer ({woken:?})"
    );
}

#[tokio::test]
async fn an_empty_claim_answers_after_its_wait() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let started = Instant::now();
    let leases = c.api.claim_wait("empty", "w", 3, 300).await;
    assert!(leases.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn a_parked_claim_finds_a_job_that_becomes_due() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut req = runlease_protocol::producer::EnqueueJobRequest::new(
        runlease_protocol::QueueName::new("later").unwrap(),
        json!(1),
    );
    req.delay_ms = Some(500);
    let job = c.api.enqueue_with(req).await;
    assert!(c.api.claim("later", "w", 1).await.is_empty(), "not due yet");
    // No wake-up is sent when a job becomes due: the timer re-check finds it.
    let leases = c.api.claim_wait("later", "w", 1, 10_000).await;
    assert_eq!(leases.first().map(|l| l.job_id), Some(job.id));
}

#[tokio::test]
async fn a_parked_read_answers_when_the_job_is_done() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, slow_recheck).await;
    let job = c.api.enqueue("q", json!(1)).await;
    let api = c.api.clone();
    let waiter = tokio::spawn(async move {
        let (status, body) = api.get(&format!("/v1/jobs/{}?wait_ms=30000", job.id)).await;
        (status, body, Instant::now())
    });
    // Parked: it has read the job queued and waits.
    c.api.until_reads_parked(1).await;
    let lease = c.api.claim_one("q", "w").await;
    let completed_at = Instant::now();
    assert_eq!(c.api.complete(&lease, json!("r")).await.0, 200);
    let (status, body, answered_at) = waiter.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(body["state"], json!(JobState::Done));
    let woken = answered_at - completed_at;
    assert!(
        woken < WOKEN_WITHIN,
        "woken by the completion, not by the re-check timer ({woken:?})"
    );

    // A read of a job that stays running answers as it is after the wait.
    let other = c.api.enqueue("q", json!(2)).await;
    let (status, body) = c.api.get(&format!("/v1/jobs/{}?wait_ms=200", other.id)).await;
    assert_eq!((status, body["state"].as_str()), (200, Some("queued")));
}

/// Sends `pieces` on a new connection, a pause between them, and reads the
/// answer (the connection stays open: it is a keep-alive one).
async fn claim_in_pieces(addr: std::net::SocketAddr, pieces: Vec<Vec<u8>>) -> String {
    use tokio::io::AsyncWriteExt;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    for piece in pieces {
        stream.write_all(&piece).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Until the head and as much body as it announces have come.
    let whole = |text: &str| {
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            return false;
        };
        let length = head.lines().find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().to_owned())
        });
        length.and_then(|v| v.parse::<usize>().ok()) == Some(body.len())
    };
    runlease_tests::raw::read_until(&mut stream, whole).await
}

#[tokio::test]
async fn parked_claims_of_every_framing_wake_on_a_local_enqueue() {
    // The coordinator peeks at a connection's first bytes to tell HTTP/2
    // from HTTP/1.1: a request whose first piece is too short to tell, one
    // whose body comes apart from its head, and HTTP/2 with prior
    // knowledge all park and get their job.
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, slow_recheck).await;
    let body = r#"{"queues":["framing"],"worker_id":"w","max_jobs":1,"wait_ms":30000}"#;
    let head = format!(
        "POST /v1/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let raw = [
        vec![b"P".to_vec(), [&head[1..], body].concat().into_bytes()],
        vec![head.clone().into_bytes(), body.as_bytes().to_vec()],
    ];
    let mut parked = Vec::new();
    for pieces in raw {
        parked.push(tokio::spawn(claim_in_pieces(c.addr, pieces)));
    }
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = format!("{}/v1/claim", c.api.base());
    let h2_claim = tokio::spawn(async move {
        let response = h2.post(url).body(body).send().await.unwrap();
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        response.text().await.unwrap()
    });
    c.api.until_claims_parked(3).await;
    let mut jobs = Vec::new();
    for i in 0..3 {
        jobs.push(c.api.enqueue("framing", json!(i)).await.id.to_string());
    }
    let mut answers = Vec::new();
    for p in parked {
        let answer = p.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        answers.push(answer);
    }
    answers.push(h2_claim.await.unwrap());
    for answer in &answers {
        let given = jobs.iter().filter(|id| answer.contains(id.as_str())).count();
        assert_eq!(given, 1, "each parked claim gets one of the jobs: {answer}");
    }
}
