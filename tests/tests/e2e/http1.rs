//! The coordinator's own HTTP/1.1 server, from outside over raw sockets:
//! pipelining, chunked bodies, `Expect: 100-continue`, HTTP/1.0 and
//! `HEAD`, framings it refuses, bodies over the limit, and a parked claim
//! whose client hangs up.

use runlease_tests::raw::{self, read_to_close};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Reads until what was read holds `needle`.
async fn read_until(stream: &mut TcpStream, needle: &str) -> String {
    raw::read_until(stream, |answer| answer.contains(needle)).await
}

/// The status codes of the answers in `text`, in order.
fn statuses(text: &str) -> Vec<u16> {
    text.match_indices("HTTP/1.1 ")
        .map(|(at, _)| text[at + 9..at + 12].parse().unwrap())
        .collect()
}

/// The JSON body of the last answer in `text`.
fn last_body(text: &str) -> Value {
    let body = text.rsplit("\r\n\r\n").next().unwrap();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn enqueue_head(queue: &str, payload: &str, extra: &str) -> (String, String) {
    let body = format!(r#"{{"queue":"{queue}","payload":{payload}}}"#);
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{extra}Content-Length: {}\r\n\r\n",
        body.len()
    );
    (head, body)
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_on_one_connection() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let (head, body) = enqueue_head("pipelined", "7", "");
    let requests = format!(
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n{head}{body}GET /v1/nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    );
    let mut stream = raw::send(c.addr, requests).await;
    let answers = read_to_close(&mut stream).await;
    assert_eq!(statuses(&answers), [200, 201, 404, 200], "{answers}");
    assert!(answers.contains("\"code\":\"not_found\""), "{answers}");
    let lease = c.api.claim_one("pipelined", "w").await;
    assert_eq!(lease.payload, json!(7));
}

#[tokio::test]
async fn a_chunked_body_after_100_continue_is_read_like_any_other() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut stream = raw::send(c.addr, b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n").await;
    let continued = read_until(&mut stream, "\r\n\r\n").await;
    assert_eq!(continued, "HTTP/1.1 100 Continue\r\n\r\n");
    let body = br#"{"queue":"chunked","payload":{"text":"in pieces"}}"#;
    let (first, second) = body.split_at(20);
    for piece in [first, second] {
        stream
            .write_all(format!("{:x};note=x\r\n", piece.len()).as_bytes())
            .await
            .unwrap();
        stream.write_all(piece).await.unwrap();
        stream.write_all(b"\r\n").await.unwrap();
    }
    stream
        .write_all(b"0\r\nX-Trailer: dropped\r\n\r\n")
        .await
        .unwrap();
    let answer = read_until(&mut stream, "\"queue\":\"chunked\"").await;
    assert!(answer.starts_with("HTTP/1.1 201 Created\r\n"), "{answer}");
    // The connection stays open for the next request.
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(statuses(&read_to_close(&mut stream).await), [200]);
    let lease = c.api.claim_one("chunked", "w").await;
    assert_eq!(lease.payload, json!({"text": "in pieces"}));
}

#[tokio::test]
async fn ambiguous_malformed_and_oversized_requests_get_the_json_error_and_a_close() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| config.server.max_body_bytes = 1024).await;
    let (head, body) = enqueue_head("refused", "1", "Transfer-Encoding: chunked\r\n");
    let cases = [
        // Both framings: how requests are smuggled past proxies.
        (format!("{head}{body}"), 400, "bad_request"),
        // A lone LF in a chunk-size line: a proxy may end the line there.
        (
            "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n2;\nxx\r\nab\r\n0\r\n\r\n".to_owned(),
            400,
            "bad_request",
        ),
        (
            "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: \r\n\r\n".to_owned(),
            400,
            "bad_request",
        ),
        (
            "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
                .to_owned(),
            400,
            "bad_request",
        ),
        (
            "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"
                .to_owned(),
            400,
            "bad_request",
        ),
        (
            format!(
                "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{}",
                "x".repeat(5000)
            ),
            413,
            "too_large",
        ),
        (
            format!(
                "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {}\r\n\r\n",
                "x".repeat(70_000)
            ),
            413,
            "too_large",
        ),
    ];
    for (request, status, code) in cases {
        let mut stream = raw::send(c.addr, &request).await;
        let answer = read_to_close(&mut stream).await;
        assert_eq!(statuses(&answer), [status], "{request:.120}: {answer}");
        assert_eq!(last_body(&answer)["error"]["code"], code, "{answer}");
        assert!(answer.contains("connection: close\r\n"), "{answer}");
    }
    // Counted by why.
    let refused = |limit: &str| format!("runlease_requests_refused_total{{limit=\"{limit}\"}}");
    assert_eq!(c.api.metric(&refused("malformed")).await, 5.0);
    assert_eq!(c.api.metric(&refused("head_bytes")).await, 1.0);
    assert_eq!(c.api.metric(&refused("body_bytes")).await, 1.0);
    let (status, jobs) = c.api.get("/v1/jobs?queue=refused").await;
    assert_eq!(status, 200);
    assert_eq!(jobs["jobs"], json!([]), "nothing refused was enqueued");
}

#[tokio::test]
async fn http10_closes_unless_kept_alive_and_head_answers_carry_no_body() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut stream = raw::send(c.addr, b"GET /healthz HTTP/1.0\r\n\r\n").await;
    let answer = read_to_close(&mut stream).await;
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(answer.contains("connection: close\r\n"), "{answer}");

    let mut stream = raw::send(c.addr, b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").await;
    let answer = read_until(&mut stream, "\"status\"").await;
    assert!(answer.contains("connection: keep-alive\r\n"), "{answer}");
    stream
        .write_all(b"HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = read_to_close(&mut stream).await;
    assert_eq!(statuses(&answer), [200], "{answer}");
    assert!(
        answer.ends_with("\r\n\r\n"),
        "a HEAD answer has no body: {answer}"
    );
}

#[tokio::test]
async fn a_claim_parked_by_a_client_that_hung_up_is_dropped_and_its_job_goes_to_the_next() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let body = r#"{"queues":["hung-up"],"worker_id":"gone","max_jobs":1,"wait_ms":30000}"#;
    let stream = raw::send(c.addr, format!(
                "POST /v1/claim HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            ).await;
    c.api.until_claims_parked(1).await;
    drop(stream);
    c.api
        .until_metric("runlease_claim_waiters", "no claim parked", |v| v == 0.0)
        .await;
    let job = c.api.enqueue("hung-up", json!("for the next")).await;
    let leases = c.api.claim("hung-up", "next", 1).await;
    assert_eq!(leases.len(), 1, "the job was leased to the client that hung up");
    assert_eq!(leases[0].job_id, job.id);
}

#[tokio::test]
async fn a_body_is_not_read_without_a_key_nor_past_the_limit() {
    const PRODUCER: &str = "producer-key-0123456789";
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.keys.api_keys = Some(format!("producer:{PRODUCER}"));
        config.server.max_body_bytes = 1024;
        // Far past the reads' 20 s: an answer that waited for the body
        // would not come in time.
        config.limits.body_timeout_ms = 120_000;
    })
    .await;
    // No key, or an unknown one: answered 401 without waiting for the body
    // it announces, and the connection closed.
    for key in ["", "Authorization: Bearer not-a-key-0123456789\r\n"] {
        let head = format!("POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n{key}Content-Length: 1000\r\n\r\n");
        let mut stream = raw::send(c.addr, head).await;
        let answer = read_to_close(&mut stream).await;
        assert_eq!(statuses(&answer), [401], "{answer}");
        assert_eq!(last_body(&answer)["error"]["code"], "unauthorized");
    }
    // A key, and a length over the limit: 413 at once, no `100 Continue`.
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {PRODUCER}\r\nExpect: 100-continue\r\nContent-Length: 5000\r\n\r\n"
    );
    let mut stream = raw::send(c.addr, head).await;
    let answer = read_to_close(&mut stream).await;
    assert_eq!(statuses(&answer), [413], "{answer}");
    assert_eq!(last_body(&answer)["error"]["code"], "too_large");
    // With the key and a body within the limit, it is read as ever.
    let (head, body) = enqueue_head(
        "keyed",
        "1",
        &format!("Authorization: Bearer {PRODUCER}\r\nConnection: close\r\n"),
    );
    let mut stream = raw::send(c.addr, format!("{head}{body}")).await;
    assert_eq!(statuses(&read_to_close(&mut stream).await), [201]);
}
