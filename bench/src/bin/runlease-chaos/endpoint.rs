//! `runlease-chaos endpoint`: the HTTP endpoint that serves the soak's
//! endpoint-served queue ([`jobs::PUSH_QUEUE`]). It verifies each push's
//! Standard Webhooks signature (HMAC-SHA256 with the queue's secret), then
//! answers as the job's kind asks on its first lease: a flaky job 500 (fail,
//! retried), a release job 503 with `Retry-After: 0` (released uncharged), a
//! stall job (and one in [`LOST_EVERY`]) not at all (it reads the push, then
//! closes the connection: the answer is lost, the job released uncharged); every other push, after the
//! handler's run time, 200 with the result derived from the job and the
//! push's run lease. Every push it read is logged, one JSON line each, with
//! what it answered (`bad_signature` fails the soak).
//!
//! One request per connection (`connection: close`), so a SIGKILL of this
//! process cuts exactly the requests it held.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::jobs::{self, Kind, Rng};
use crate::worker::Log;

/// The endpoint mode's settings.
pub struct EndpointArgs {
    /// Where it listens (127.0.0.1:PORT).
    pub listen: String,
    /// Where the pushes it read go (appended).
    pub log: PathBuf,
    /// Its name in the results it answers.
    pub id: String,
    /// The queue's endpoint secret, `whsec_...`.
    pub secret: String,
    /// The handler's run time, ms, drawn from `lo..=hi` per push.
    pub work_ms: (u64, u64),
}

/// Besides the stall jobs, one push in this many loses its answer on its
/// first lease (the stall jobs alone are too rare among pushed jobs).
const LOST_EVERY: u64 = 17;

/// Most bytes of a push it reads.
const MAX_REQUEST: usize = 4 << 20;

/// Runs until killed.
pub async fn run(args: EndpointArgs) -> anyhow::Result<()> {
    let key = BASE64
        .decode(args.secret.trim_start_matches("whsec_"))
        .context("the secret is not whsec_ and base64")?;
    let log = Log::open(&args.log)?;
    let listener = TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let shared = Arc::new((key, log, args.id.clone(), args.work_ms));
    let mut serial = 0u64;
    loop {
        let (stream, _) = listener.accept().await?;
        serial += 1;
        let shared = shared.clone();
        tokio::spawn(async move {
            let (key, log, id, work_ms) = &*shared;
            let mut rng = Rng::new(jobs::splitmix64(serial));
            let work = Duration::from_millis(rng.between(work_ms.0, work_ms.1));
            serve(stream, key, log, id, work).await;
        });
    }
}

/// A request: its header lines (lower-cased names) and its body.
struct Request {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

async fn read_request(stream: &mut TcpStream) -> Option<Request> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > MAX_REQUEST {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    if length > MAX_REQUEST {
        return None;
    }
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(Request {
        headers,
        body: buf[head_end..head_end + length].to_vec(),
    })
}

/// Whether one of the request's signatures is ours over its raw body, and
/// its timestamp within 5 minutes of now (Standard Webhooks).
fn verified(request: &Request, key: &[u8]) -> bool {
    let (Some(id), Some(ts), Some(signatures)) = (
        request.header("webhook-id"),
        request.header("webhook-timestamp"),
        request.header("webhook-signature"),
    ) else {
        return false;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if ts.parse::<i64>().map_or(true, |t| (now - t).abs() > 300) {
        return false;
    }
    let mut message = format!("{id}.{ts}.").into_bytes();
    message.extend_from_slice(&request.body);
    let ours = format!(
        "v1,{}",
        BASE64.encode(runlease_tests::webhooks::hmac_sha256(key, &message))
    );
    signatures.split(' ').any(|s| s == ours)
}

async fn answer(stream: &mut TcpStream, status: &str, extra: &str, body: &str) {
    let text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(text.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn serve(mut stream: TcpStream, key: &[u8], log: &Log, id: &str, work: Duration) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let push: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
    let n = push["job"]["payload"]["n"].as_u64().unwrap_or(u64::MAX);
    let run_lease = push["lease"]["run_lease"].as_i64().unwrap_or(0);
    let mut record = json!({
        "endpoint": id,
        "job_id": push["job"]["id"],
        "run_lease": run_lease,
        "n": n,
    });
    if !verified(&request, key) {
        record["answer"] = json!("bad_signature");
        log.write(&record);
        answer(&mut stream, "401 Unauthorized", "", r#"{"error":"signature"}"#).await;
        return;
    }
    let first = run_lease == 1;
    match Kind::parse(push["job"]["payload"]["kind"].as_str().unwrap_or("")) {
        Kind::Flaky if first => {
            record["answer"] = json!(500);
            log.write(&record);
            answer(
                &mut stream,
                "500 Internal Server Error",
                "",
                r#"{"error":"flaky on its first lease"}"#,
            )
            .await;
        }
        Kind::Release if first => {
            record["answer"] = json!(503);
            log.write(&record);
            answer(&mut stream, "503 Service Unavailable", "retry-after: 0\r\n", "{}").await;
        }
        kind if first && (kind == Kind::Stall || n % LOST_EVERY == 5) => {
            // The answer is lost: the connection closes without one.
            record["answer"] = json!("dropped");
            log.write(&record);
        }
        _ => {
            tokio::time::sleep(work).await;
            let result = jobs::result(n, run_lease, id);
            record["answer"] = json!(200);
            record["result"] = result.clone();
            log.write(&record);
            answer(&mut stream, "200 OK", "", &result.to_string()).await;
        }
    }
}
