//! Nothing a client sends, with or without a key, grows the coordinator's
//! memory or work without bound: each test drives one abuse from outside,
//! over real sockets, and checks the limit that stops it.

use std::time::{Duration, Instant};

use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const WORKER: &str = "worker-key-0123456789";
const OTHER_WORKER: &str = "other-worker-key-0123456789";
const EMAILS_WORKER: &str = "emails-worker-key-0123456789";
const PRODUCER: &str = "producer-key-0123456789";

/// Sends `request` on a new connection and reads until the server closes it
/// or `within` passes; the bytes read.
async fn raw(addr: std::net::SocketAddr, request: &[u8], within: Duration) -> String {
    let mut stream = runlease_tests::raw::send(addr, request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(within, stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Every `method` label value of the request-duration series in `/metrics`.
fn method_labels(metrics: &str) -> std::collections::BTreeSet<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with("runlease_request_duration_seconds"))
        .filter_map(|l| {
            let start = l.find("method=\"")? + "method=\"".len();
            let len = l[start..].find('"')?;
            Some(l[start..start + len].to_owned())
        })
        .collect()
}

#[tokio::test]
async fn made_up_methods_add_no_metric_series() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for n in 0..50 {
        let answer = raw(
            c.addr,
            format!("MADEUP{n} /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
            Duration::from_secs(10),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    }
    // A method of hundreds of kilobytes is refused by the parser.
    let huge = format!(
        "{} /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "X".repeat(300_000)
    );
    let answer = raw(c.addr, huge.as_bytes(), Duration::from_secs(10)).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "a huge method was served: {answer:.200}"
    );

    let (status, metrics) = c.api.get_text("/metrics").await;
    assert_eq!(status, 200);
    let methods = method_labels(&metrics);
    assert!(methods.contains("other"), "{methods:?}");
    assert!(
        methods.iter().all(|m| [
            "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "TRACE", "CONNECT", "other"
        ]
        .contains(&m.as_str())),
        "method labels: {methods:?}"
    );
    assert!(!metrics.contains("MADEUP"), "a made-up method reached /metrics");
    assert!(
        metrics.len() < 200_000,
        "/metrics grew to {} bytes",
        metrics.len()
    );
}

#[tokio::test]
async fn half_sent_headers_are_closed_within_the_deadline_while_healthz_answers() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.limits.header_timeout_ms = 2_000;
    })
    .await;
    let started = Instant::now();
    let mut slow = Vec::new();
    for _ in 0..400 {
        let mut stream = TcpStream::connect(c.addr).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            .await
            .unwrap();
        slow.push(stream);
    }
    // One byte now and then: each keeps the head unfinished.
    let drip = tokio::spawn(async move {
        let mut closed_at = vec![None; slow.len()];
        let mut buf = [0u8; 64];
        loop {
            for (i, stream) in slow.iter_mut().enumerate() {
                if closed_at[i].is_some() {
                    continue;
                }
                let _ = stream.write_all(b"a").await;
                if let Ok(Ok(0) | Err(_)) =
                    tokio::time::timeout(Duration::from_millis(1), stream.read(&mut buf)).await
                {
                    closed_at[i] = Some(Instant::now());
                }
            }
            if closed_at.iter().all(Option::is_some) || started.elapsed() > Duration::from_secs(30) {
                return closed_at;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    // Meanwhile the coordinator answers.
    let (status, _) = c.api.get("/healthz").await;
    assert_eq!(status, 200);
    let closed_at = drip.await.unwrap();
    let open = closed_at.iter().filter(|c| c.is_none()).count();
    assert_eq!(
        open, 0,
        "{open} of 400 half-sent heads were still open after 30 s"
    );
    let last = closed_at.iter().flatten().max().unwrap().duration_since(started);
    eprintln!(
        "400 half-sent heads (header deadline 2 s): the last was closed {last:?} after the first was opened"
    );
    assert!(
        last < Duration::from_secs(8),
        "the last half-sent head was closed after {last:?}"
    );
    let (status, _) = c.api.get("/healthz").await;
    assert_eq!(status, 200);
    let timed_out = c
        .api
        .metric("runlease_connections_timed_out_total{phase=\"header\"}")
        .await;
    assert!(timed_out >= 400.0, "{timed_out}");
}

#[tokio::test]
async fn idle_connections_and_unsent_bodies_are_closed() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.limits.idle_timeout_ms = 1_000;
        config.limits.body_timeout_ms = 1_000;
    })
    .await;
    // A connection that never sends a byte.
    let started = Instant::now();
    let answer = raw(c.addr, b"", Duration::from_secs(20)).await;
    assert_eq!(answer, "");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // A head that promises a body that never comes: 400, the JSON error body.
    let answer = raw(
        c.addr,
        b"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"queue\"",
        Duration::from_secs(20),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("RUNLEASE_BODY_TIMEOUT_MS"), "{answer}");
    // A kept-alive connection after its answer: closed once idle.
    let mut stream = TcpStream::connect(c.addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "an idle kept-alive connection stayed open");
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
}

/// Opens a connection and sends `head`; the answer read within `within`
/// (empty: none yet, the request is in flight).
async fn open_with(addr: std::net::SocketAddr, head: &str, within: Duration) -> (TcpStream, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = match tokio::time::timeout(within, stream.read(&mut buf)).await {
        Ok(Ok(n)) => n,
        _ => 0,
    };
    (stream, String::from_utf8_lossy(&buf[..n]).into_owned())
}

#[tokio::test]
async fn at_the_connection_cap_an_idle_connection_makes_room_and_busy_ones_mean_overloaded() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.limits.max_connections = 16;
    })
    .await;
    let healthz = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    // 16 connections that sent one request and then nothing: each new
    // connection closes the one idle the longest and is served.
    let mut idle = Vec::new();
    for _ in 0..20 {
        let (stream, answer) = open_with(c.addr, healthz, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        idle.push(stream);
    }
    assert!(c.api.metric("runlease_connections_evicted_total").await >= 4.0);
    drop(idle);
    // Connections each holding a parked read: once every slot is busy, one
    // more is answered 503 overloaded, with a JSON body of the stated length.
    let job = c.api.enqueue("q", json!(1)).await;
    let parked = format!(
        "GET /v1/jobs/{}?wait_ms=30000 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        job.id
    );
    let mut busy = Vec::new();
    let refused = loop {
        let (stream, answer) = open_with(c.addr, &parked, Duration::from_millis(500)).await;
        if answer.is_empty() {
            busy.push(stream);
            assert!(busy.len() <= 16, "more than 16 connections were served");
            continue;
        }
        break answer;
    };
    assert!(busy.len() >= 12, "only {} connections before the cap", busy.len());
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(
        refused.to_ascii_lowercase().contains("retry-after: 1"),
        "{refused}"
    );
    let (head, body) = refused.split_once("\r\n\r\n").unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_owned)
        })
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(length, body.len(), "{refused}");
    let body: Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    drop(busy);
    // Slots come back as connections close.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = raw(
            c.addr,
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
            Duration::from_secs(10),
        )
        .await;
        if answer.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "slots never came back: {answer}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(c.api.metric("runlease_connections_refused_total").await >= 1.0);
}

#[tokio::test]
async fn a_slow_reader_gets_a_large_answer_whole_past_the_idle_timeout() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.limits.idle_timeout_ms = 1_000;
    })
    .await;
    let pad = "x".repeat(200_000);
    for n in 0..15 {
        c.api.enqueue("big", json!({"n": n, "pad": pad})).await;
    }
    let listing = "GET /v1/jobs?queue=big&state=queued&limit=50 HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    // Read 64 KiB every 150 ms: about 3 MB over several idle timeouts.
    let mut stream = TcpStream::connect(c.addr).await.unwrap();
    stream.write_all(listing.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let started = Instant::now();
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let page: Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("a cut answer ({} bytes after {took:?}): {e}", body.len()));
    assert_eq!(page["jobs"].as_array().unwrap().len(), 15);
    assert!(
        took > Duration::from_secs(2),
        "read in {took:?}: not slow enough to prove anything"
    );
}

#[tokio::test]
async fn claims_parked_with_distinct_time_left_leave_other_workers_served_and_the_excess_is_429() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.keys.api_keys = Some(format!(
            "worker:{WORKER},worker:{OTHER_WORKER},producer:{PRODUCER}"
        ));
        config.limits.max_parked_claims_per_key = 2_000;
    })
    .await;
    let hostile = c.api.with_key(WORKER);
    // 2,000 claims of one key, each of another shape: a time left no job fits.
    let mut parked = Vec::new();
    for n in 1..=2000u64 {
        let api = hostile.clone();
        parked.push(tokio::spawn(async move {
            api.post(
                "/v1/claim",
                &json!({"queues": ["q"], "worker_id": format!("w{n}"), "max_jobs": 1, "wait_ms": 60_000, "time_left_ms": n}),
            )
            .await
        }));
    }
    c.api.until_claims_parked(2000).await;
    // One more of the same key: 429 with Retry-After.
    let response = reqwest::Client::new()
        .post(format!("{}/v1/claim", c.api.base()))
        .bearer_auth(WORKER)
        .json(&json!({"queues": ["q"], "worker_id": "w0", "max_jobs": 1, "wait_ms": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("RUNLEASE_MAX_PARKED_CLAIMS_PER_KEY")
    );
    // A claim that does not wait needs no place.
    let (status, _) = hostile
        .post(
            "/v1/claim",
            &json!({"queues": ["q"], "worker_id": "w0", "max_jobs": 1, "wait_ms": 0}),
        )
        .await;
    assert_eq!(status, 200);

    // Another worker's parked claim is answered within a second of an enqueue.
    let other = c.api.with_key(OTHER_WORKER);
    let waiting = tokio::spawn(async move {
        let (status, body) = other
            .post(
                "/v1/claim",
                &json!({"queues": ["q"], "worker_id": "honest", "max_jobs": 1, "wait_ms": 30_000}),
            )
            .await;
        (status, body, Instant::now())
    });
    c.api.until_claims_parked(2001).await;
    let enqueued = Instant::now();
    let (status, _) = c
        .api
        .with_key(PRODUCER)
        .post("/v1/jobs", &json!({"queue": "q", "payload": "fresh"}))
        .await;
    assert_eq!(status, 201);
    let (status, body, answered) = waiting.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"][0]["payload"], "fresh", "{body}");
    let took = answered.duration_since(enqueued);
    eprintln!(
        "with 2,000 claims of distinct time_left_ms parked by one key, another worker's parked claim was answered {took:?} after the enqueue"
    );
    assert!(took < Duration::from_secs(1), "the honest claim took {took:?}");
    assert!(
        c.api
            .metric("runlease_requests_refused_total{limit=\"parked_claims\"}")
            .await
            >= 1.0
    );
    for p in parked {
        p.abort();
    }
}

#[tokio::test]
async fn parked_reads_are_capped_per_key() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.limits.max_parked_reads_per_key = 5;
    })
    .await;
    let job = c.api.enqueue("q", json!(1)).await;
    let mut parked = Vec::new();
    for _ in 0..5 {
        let api = c.api.clone();
        let id = job.id;
        parked.push(tokio::spawn(async move {
            api.get(&format!("/v1/jobs/{id}?wait_ms=30000")).await
        }));
    }
    c.api.until_reads_parked(5).await;
    let (status, body) = c.api.get(&format!("/v1/jobs/{}?wait_ms=30000", job.id)).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("overloaded")),
        "{body}"
    );
    // A read that does not wait is answered as always.
    let (status, _) = c.api.get(&format!("/v1/jobs/{}", job.id)).await;
    assert_eq!(status, 200);
    // The parked ones still end as their job does.
    let lease = c.api.claim_one("q", "w").await;
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    for p in parked {
        let (status, body) = p.await.unwrap();
        assert_eq!((status, body["state"].as_str()), (200, Some("done")));
    }
}

#[tokio::test]
async fn open_mode_refuses_web_pages_and_rebound_hosts_and_keeps_curl_working() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let http = reqwest::Client::new();
    let port = c.addr.port();
    let jobs = format!("{}/v1/jobs", c.api.base());
    let body = r#"{"queue": "q", "payload": "from a page"}"#;
    let own = format!("http://127.0.0.1:{port}");
    let rebound = format!("rebound.example:{port}");
    let (page, same_origin) = (
        vec![("origin", "http://evil.example")],
        vec![("origin", own.as_str())],
    );
    // Sends `method url` with `headers` (and `body` for a POST); its status.
    let send = |method: &str, url: String, headers: Vec<(&str, &str)>| {
        let mut request = if method == "POST" {
            http.post(url).body(body)
        } else {
            http.get(url)
        };
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let text_plain = [("content-type", "text/plain")];
    let refused = [
        // A page's text/plain POST: no preflight, so only the coordinator can refuse it.
        (
            "POST",
            jobs.clone(),
            [&text_plain[..], &page, &[("sec-fetch-site", "cross-site")]].concat(),
        ),
        // The same with only the Origin header.
        ("POST", jobs.clone(), [&text_plain[..], &page].concat()),
        // DNS rebinding: the page's own host name, resolved to loopback.
        (
            "GET",
            format!("{}/v1/queues", c.api.base()),
            vec![("host", rebound.as_str())],
        ),
    ];
    for (method, url, headers) in refused {
        assert_eq!(send(method, url.clone(), headers).await, 403, "{method} {url}");
    }
    let response = http
        .post(&jobs)
        .header("content-type", "text/plain")
        .header("origin", "http://evil.example")
        .body(body)
        .send()
        .await
        .unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
    // Nothing was enqueued.
    let (_, queues) = c.api.get("/v1/queues").await;
    assert_eq!(queues["queues"], json!([]), "{queues}");
    // curl -d: no Origin, a form content type; the dashboard's own origin;
    // a host named localhost.
    let served = [
        (
            "POST",
            jobs.clone(),
            vec![("content-type", "application/x-www-form-urlencoded")],
            201,
        ),
        (
            "POST",
            jobs.clone(),
            [&same_origin[..], &[("sec-fetch-site", "same-origin")]].concat(),
            201,
        ),
        ("GET", format!("http://localhost:{port}/healthz"), vec![], 200),
    ];
    for (method, url, headers, status) in served {
        assert_eq!(send(method, url.clone(), headers).await, status, "{method} {url}");
    }
    assert!(
        c.api
            .metric("runlease_requests_refused_total{limit=\"cross_origin\"}")
            .await
            >= 2.0
    );
}

#[tokio::test]
async fn a_lease_token_is_honoured_only_with_a_key_of_its_queue() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.keys.api_keys = Some(format!(
            "worker:{WORKER}:reports,worker:{EMAILS_WORKER}:emails,producer:{PRODUCER}"
        ));
    })
    .await;
    let producer = c.api.with_key(PRODUCER);
    let reports = c.api.with_key(WORKER);
    let emails = c.api.with_key(EMAILS_WORKER);
    let (status, _) = producer
        .post("/v1/jobs", &json!({"queue": "emails", "payload": 1}))
        .await;
    assert_eq!(status, 201);
    let lease = emails.claim_one("emails", "w").await;
    let token = &lease.lease_token;
    // The reports key may not touch a lease of an emails job.
    for (path, body) in [
        ("/v1/heartbeat", json!({"leases": [{"lease_token": token}]})),
        ("/v1/complete", json!({"lease_token": token, "result": "stolen"})),
        ("/v1/fail", json!({"lease_token": token, "error": "stolen"})),
        ("/v1/release", json!({"lease_token": token})),
        (
            "/v1/finish",
            json!({"items": [{"lease_token": token, "action": "complete"}]}),
        ),
    ] {
        let (status, answer) = reports.post(path, &body).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (403, Some("forbidden")),
            "{path}: {answer}"
        );
    }
    let job = emails.job(lease.job_id).await;
    assert_eq!(job.state.as_str(), "running");
    // A token from before tokens named their queue, used with a key limited
    // to some queues: that item is lease_lost, the request's others as usual.
    let old = runlease_coordinator::token::TokenKey::new(runlease_tests::TEST_SECRET.as_bytes())
        .minting(1)
        .mint(
            lease.job_id,
            lease.run_lease,
            &runlease_protocol::WorkerId::new("w").unwrap(),
            &runlease_protocol::QueueName::new("emails").unwrap(),
        );
    let body = json!({"leases": [{"lease_token": old}, {"lease_token": token}]});
    let (status, answer) = emails.post("/v1/heartbeat", &body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["leases"][0]["status"], "lease_lost");
    assert_eq!(answer["leases"][1]["status"], "renewed");
    // Its own key finishes it.
    assert_eq!(emails.heartbeat(&lease).await, "renewed");
    let (status, done) = emails.complete(&lease, json!("ok")).await;
    assert_eq!((status, done["state"].as_str()), (200, Some("done")));
}

#[tokio::test]
async fn a_job_with_thousands_of_attempts_answers_in_bounded_size_and_pages_its_chronology() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("q", json!("loop")).await;
    // A claim/release loop: every release ends an attempt, charging nothing.
    const ATTEMPTS: usize = 1_200;
    let mut lease = c.api.claim_one("q", "looper").await;
    for _ in 1..ATTEMPTS {
        let (status, body) = c
            .api
            .post(
                "/v1/finish",
                &json!({
                    "items": [{"lease_token": lease.lease_token, "action": "release"}],
                    "claim": {"queues": ["q"], "worker_id": "looper", "max_jobs": 1, "wait_ms": 0},
                }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        lease = serde_json::from_value(body["leases"][0].clone()).unwrap();
    }
    let started = Instant::now();
    let (status, text) = c.api.get_text(&format!("/v1/jobs/{}", job.id)).await;
    let took = started.elapsed();
    assert_eq!(status, 200);
    eprintln!(
        "a job with {ATTEMPTS} attempts: read in {took:?}, {} bytes",
        text.len()
    );
    assert!(text.len() < 64 * 1024, "a job read is {} bytes", text.len());
    assert!(took < Duration::from_secs(2), "a job read took {took:?}");
    let read: Value = serde_json::from_str(&text).unwrap();
    let attempts = read["attempts"].as_array().unwrap();
    assert_eq!(
        attempts.len(),
        101,
        "the latest 100 ended attempts, then the running one"
    );
    assert_eq!(read["earlier_attempts"], true);
    assert_eq!(attempts.last().unwrap()["run_lease"], ATTEMPTS as i64);
    assert_eq!(attempts[0]["run_lease"], (ATTEMPTS - 100) as i64);

    // Paged back to the first attempt, every ended attempt once, in order.
    let mut seen = Vec::new();
    let mut before: Option<i64> = None;
    loop {
        let path = match before {
            Some(b) => format!("/v1/jobs/{}/attempts?limit=500&before={b}", job.id),
            None => format!("/v1/jobs/{}/attempts?limit=500", job.id),
        };
        let (status, page) = c.api.get(&path).await;
        assert_eq!(status, 200, "{page}");
        let entries = page["attempts"].as_array().unwrap();
        let leases: Vec<i64> = entries.iter().map(|a| a["run_lease"].as_i64().unwrap()).collect();
        seen.splice(0..0, leases.iter().copied());
        if page["earlier"] == false {
            break;
        }
        before = leases.first().copied();
    }
    let expected: Vec<i64> = (1..ATTEMPTS as i64).collect();
    assert_eq!(seen, expected);
    let (status, body) = c.api.get(&format!("/v1/jobs/{}/attempts?limit=0", job.id)).await;
    assert_eq!((status, body["error"]["code"].as_str()), (422, Some("invalid")));
}

#[tokio::test]
async fn list_and_claim_answers_are_capped_in_bytes() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |config| {
        config.limits.max_answer_bytes = 1024 * 1024;
    })
    .await;
    let big = "x".repeat(100_000);
    let mut ids = Vec::new();
    for n in 0..30 {
        ids.push(c.api.enqueue("q", json!({"n": n, "pad": big})).await.id);
    }
    // A listing pages through all of them, no page over the cap.
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/jobs?queue=q&state=queued&limit=500&cursor={c}"),
            None => "/v1/jobs?queue=q&state=queued&limit=500".to_owned(),
        };
        let (status, text) = c.api.get_text(&path).await;
        assert_eq!(status, 200);
        assert!(
            text.len() <= 1024 * 1024 + 200_000,
            "a page of {} bytes",
            text.len()
        );
        let page: Value = serde_json::from_str(&text).unwrap();
        let jobs = page["jobs"].as_array().unwrap();
        assert!(
            !jobs.is_empty() && jobs.len() < 30,
            "{} jobs on a page",
            jobs.len()
        );
        listed.extend(jobs.iter().map(|j| j["id"].as_str().unwrap().to_owned()));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let mut expected: Vec<String> = ids.iter().map(ToString::to_string).collect();
    expected.reverse();
    assert_eq!(listed, expected, "every job once, newest first");

    // A claim of all 30 hands out what fits; the rest stay claimable, uncharged.
    let (status, text) = c
        .api
        .post(
            "/v1/claim",
            &json!({"queues": ["q"], "worker_id": "w", "max_jobs": 30, "wait_ms": 0}),
        )
        .await;
    assert_eq!(status, 200);
    let leases = text["leases"].as_array().unwrap();
    assert!(!leases.is_empty() && leases.len() < 30, "{} leases", leases.len());
    assert!(text.to_string().len() <= 1024 * 1024 + 200_000);
    let (_, queues) = c.api.get("/v1/queues").await;
    assert_eq!(
        queues["queues"][0]["counts"]["queued"].as_u64().unwrap() as usize,
        30 - leases.len(),
        "{queues}"
    );
    let rest = c.api.claim("q", "w2", 30).await;
    assert!(
        rest.iter().all(|l| l.attempt == 1),
        "given-back jobs were not charged"
    );
}

#[tokio::test]
async fn claims_of_many_shapes_from_one_key_are_refused_past_the_shape_limit() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // Every claim names q and a queue of its own: each is a statement of
    // its own at every enqueue on q.
    let shapes = runlease_coordinator::limits::MAX_PARKED_SHAPES_PER_KEY;
    let mut parked = Vec::new();
    for n in 0..shapes {
        let api = c.api.clone();
        parked.push(tokio::spawn(async move {
            api.post(
                "/v1/claim",
                &json!({"queues": ["q", format!("other-{n}")], "worker_id": "w", "max_jobs": 1, "wait_ms": 60_000}),
            )
            .await
        }));
    }
    c.api.until_claims_parked(shapes as u32).await;
    let (status, body) = c
        .api
        .post(
            "/v1/claim",
            &json!({"queues": ["q", "one-more"], "worker_id": "w", "max_jobs": 1, "wait_ms": 60_000}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (429, Some("overloaded")),
        "{body}"
    );
    // A claim of a shape already parked still parks, and is served.
    let same = tokio::spawn({
        let api = c.api.clone();
        async move {
            api.post(
                "/v1/claim",
                &json!({"queues": ["q", "other-0"], "worker_id": "w", "max_jobs": 1, "wait_ms": 30_000}),
            )
            .await
        }
    });
    c.api.until_claims_parked(shapes as u32 + 1).await;
    // A job for every parked claim: each is served, the last one too.
    let jobs: Vec<serde_json::Value> = (0..=shapes)
        .map(|n| json!({"queue": "q", "payload": n}))
        .collect();
    let (status, _) = c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await;
    assert_eq!(status, 201);
    let (status, body) = same.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["leases"].as_array().map(Vec::len), Some(1), "{body}");
    for p in parked {
        p.abort();
    }
}
