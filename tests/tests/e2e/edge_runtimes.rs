//! Endpoint-served queues against real edge runtimes and a Standard
//! Webhooks library written by others, with the examples of
//! `examples/edge/` as the endpoints:
//!
//! - the Cloudflare Worker (`cloudflare/worker.ts`, bundled with esbuild)
//!   in workerd, Cloudflare's own runtime, through miniflare; it verifies
//!   every request with the npm `standardwebhooks` package;
//! - the Deno Deploy handler (`deno/main.ts`) in Deno (from npm), with the
//!   same npm package;
//! - the Lambda function URL (`lambda/app.py`) behind `lambda/local.py`,
//!   verifying with the PyPI `standardwebhooks` package.
//!
//! Each completes short jobs in its answer, fails a job it can never run
//! without a retry, and hands a long one off with 202 (ctx.waitUntil in
//! workerd, a promise left running in Deno, a thread for the Lambda), heartbeating its progress and
//! completing it over fetch/urllib. A request with a forged signature or a
//! stale timestamp is refused by the library (401) and leaves the job as
//! it was, while the same request signed now would run it; a replay of a
//! handled request runs again at the endpoint, but its calls carry a lease
//! that has ended and the coordinator refuses them. A key rotation: both
//! secrets verify during the window, only the new one after.
//!
//! `npm ci` (examples/edge/package-lock.json) and a virtualenv with
//! examples/edge/lambda/requirements.txt are installed here when missing, as
//! `scripts/test` does beforehand. Node.js 20+, npm and python3 must be on
//! PATH: without them these tests fail, they never skip.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use runlease_protocol::JobState;
use runlease_protocol::worker::Lease;
use runlease_tests::api::{terminal, until};
use runlease_tests::process::free_port;
use runlease_tests::{Api, TestCoordinator, TestDb};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::process::{Child, ChildStdout, Command};

pub(crate) const QUEUE: &str = "edge";
/// A queue nobody serves: its jobs are claimed by the test itself, to
/// craft requests around a real lease.
const PULLED: &str = "pulled";

pub(crate) fn edge_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/edge");
    assert!(dir.join("package.json").exists(), "{} is missing", dir.display());
    dir
}

/// Runs `program args` in `dir`, failing the test with its output if it fails.
fn run(dir: &Path, program: &str, args: &[&str]) {
    runlease_tests::process::run_tool(dir, program, args, "for the edge runtime tests");
}

/// A file lock beside the test binaries: test processes install one at a
/// time, so none runs `npm ci` or pip under another's feet.
fn install_lock(name: &str) -> File {
    let exe = std::env::current_exe().unwrap();
    let lock = File::create(exe.parent().unwrap().join(format!("{name}.install.lock"))).unwrap();
    lock.lock().unwrap();
    lock
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// `npm ci` unless node_modules was installed from this package-lock.json,
/// then the Workers' bundles (the example's, and the one on the runlease
/// library, which is built first: `sdk_typescript::built`) unless they are
/// newer than their sources (once per test process).
pub(crate) fn build_worker() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let library = crate::sdk_typescript::built();
            let dir = edge_dir();
            let _lock = install_lock("edge-examples");
            let lock = std::fs::read(dir.join("package-lock.json")).unwrap();
            let stamp = dir.join("node_modules/.runlease-package-lock.json");
            if std::fs::read(&stamp).ok().as_deref() != Some(lock.as_slice()) {
                run(&dir, "npm", &["ci", "--no-audit", "--no-fund"]);
                std::fs::write(&stamp, &lock).unwrap();
            }
            let bundle = ["dist/cloudflare-worker.mjs", "dist/sdk-cloudflare-worker.mjs"]
                .iter()
                .map(|p| modified(&dir.join(p)))
                .min()
                .flatten();
            let inputs = [
                dir.join("cloudflare/worker.ts"),
                dir.join("sdk/cloudflare.ts"),
                dir.join("sdk/jobs.ts"),
                library.join("dist/index.js"),
                stamp,
            ]
            .iter()
            .filter_map(|p| modified(p))
            .max();
            if bundle.is_none() || bundle <= inputs {
                run(&dir, "npm", &["run", "--silent", "build"]);
            }
            dir
        })
        .clone()
}

/// A virtualenv holding lambda/requirements.txt (the PyPI
/// `standardwebhooks`), beside the cargo target directory; rebuilt when the
/// requirements change. Answers its python.
fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let requirements = edge_dir().join("lambda/requirements.txt");
            let wanted = std::fs::read(&requirements).unwrap();
            let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
                || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"),
                PathBuf::from,
            );
            let venv = target.join("edge-python");
            let python = venv.join("bin/python");
            let stamp = venv.join(".requirements.txt");
            let _lock = install_lock("edge-python");
            if !python.exists() || std::fs::read(&stamp).ok().as_deref() != Some(wanted.as_slice()) {
                let _ = std::fs::remove_dir_all(&venv);
                run(&target, "python3", &["-m", "venv", venv.to_str().unwrap()]);
                run(
                    &target,
                    python.to_str().unwrap(),
                    &[
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "-r",
                        requirements.to_str().unwrap(),
                    ],
                );
                std::fs::write(&stamp, &wanted).unwrap();
            }
            python
        })
        .clone()
}

/// An endpoint process: the Worker in workerd, the Deno handler, or the
/// Lambda function behind local.py. Stopped with SIGTERM (to its pid only)
/// when dropped, and waited for: run-workerd.mjs then stops workerd, its
/// child, which a SIGKILL of node would leave running.
pub(crate) struct Endpoint {
    pub(crate) url: String,
    pub(crate) child: Child,
    pub(crate) _lines: Lines<BufReader<ChildStdout>>,
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        let Some(pid) = self.child.id().filter(|pid| *pid > 1) else {
            return;
        };
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && !matches!(self.child.try_wait(), Ok(Some(_))) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The first line of `child`'s standard output, as JSON (30 s at most).
pub(crate) async fn first_line(child: &mut Child, what: &str) -> (Value, Lines<BufReader<ChildStdout>>) {
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .unwrap_or_else(|_| panic!("{what} did not say where it listens within 30 s"))
        .unwrap()
        .unwrap_or_else(|| panic!("{what} exited before it listened"));
    (
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{what}: {line:?}: {e}")),
        lines,
    )
}

impl Endpoint {
    /// The Cloudflare Worker in workerd on `port`, with `secret`.
    async fn workerd(secret: &str, port: u16) -> Self {
        Self::workerd_bundle("dist/cloudflare-worker.mjs", secret, port).await
    }

    /// The Worker of `bundle` (under examples/edge) in workerd on `port`.
    pub(crate) async fn workerd_bundle(bundle: &str, secret: &str, port: u16) -> Self {
        let dir = build_worker();
        let mut child = Command::new("node")
            .arg("run-workerd.mjs")
            .arg(bundle)
            .current_dir(&dir)
            .env("RUNLEASE_ENDPOINT_SECRET", secret)
            .env("PORT", port.to_string())
            .env_remove("RUNLEASE_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("node must be on PATH (Node.js 20 or later)");
        let (said, lines) = first_line(&mut child, "workerd").await;
        let url = said["listening"].as_str().expect("{listening: url}").to_owned();
        assert_eq!(url, format!("http://127.0.0.1:{port}/"));
        Self {
            url,
            child,
            _lines: lines,
        }
    }

    /// The Deno Deploy handler (deno/main.ts) in Deno on `port`; Deno comes
    /// from npm (the `deno` package's binary), and resolves the example's
    /// `npm:standardwebhooks` from node_modules.
    async fn deno(secret: &str, port: u16) -> Self {
        Self::deno_script("deno/main.ts", secret, port).await
    }

    /// The Deno handler of `script` (under examples/edge) in Deno on `port`.
    pub(crate) async fn deno_script(script: &str, secret: &str, port: u16) -> Self {
        let dir = build_worker();
        let deno = [
            "node_modules/@deno/linux-x64-glibc/deno",
            "node_modules/deno/deno",
        ]
        .iter()
        .map(|p| dir.join(p))
        .find(|p| p.exists())
        .expect("Deno from npm (examples/edge: npm ci) must be installed");
        let mut child = Command::new(&deno)
            .args(["run", "--allow-net", "--allow-env", script])
            .current_dir(&dir)
            .env("RUNLEASE_ENDPOINT_SECRET", secret)
            .env("PORT", port.to_string())
            .env("DENO_NO_UPDATE_CHECK", "1")
            .env_remove("RUNLEASE_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", deno.display()));
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "Deno did not listen on {port} within 30 s"
            );
            if let Ok(Some(status)) = child.try_wait() {
                panic!("Deno exited before it listened: {status}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            url: format!("http://127.0.0.1:{port}/"),
            child,
            _lines: lines,
        }
    }

    /// The Lambda function of lambda/app.py behind local.py on `port`.
    async fn lambda(secret: &str, port: u16) -> Self {
        let python = python();
        let mut child = Command::new(&python)
            .arg("local.py")
            .arg(port.to_string())
            .current_dir(edge_dir().join("lambda"))
            .env("RUNLEASE_ENDPOINT_SECRET", secret)
            .env_remove("RUNLEASE_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
        let (said, lines) = first_line(&mut child, "local.py").await;
        assert_eq!(said["listening"], port, "{said}");
        Self {
            url: format!("http://127.0.0.1:{port}/"),
            child,
            _lines: lines,
        }
    }
}

/// A coordinator that may push to 127.0.0.1, with a rotation window of
/// `rotation`.
async fn coordinator(db: &TestDb, rotation: Duration) -> TestCoordinator {
    TestCoordinator::start_with(db, |cfg| {
        cfg.endpoints.allow_hosts = Some("127.0.0.1".to_owned());
        cfg.endpoints.rotation = rotation;
    })
    .await
}

pub(crate) async fn set_endpoint(api: &Api, url: &str) {
    let (status, body) = api
        .patch(
            &format!("/v1/queues/{QUEUE}"),
            &json!({"endpoint": {"url": url, "timeout_ms": 10_000, "concurrency": 4}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
}

pub(crate) async fn secret(api: &Api) -> Value {
    let (status, body) = api.get(&format!("/v1/queues/{QUEUE}/endpoint-secret")).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Sets the queue's endpoint to 127.0.0.1:`port` (making its secret), and
/// answers the port and the secret.
pub(crate) async fn endpoint_on_a_free_port(api: &Api) -> (u16, String) {
    let port = free_port();
    set_endpoint(api, &format!("http://127.0.0.1:{port}/")).await;
    let secret = secret(api).await["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    (port, secret)
}

/// Standard Webhooks headers for `body` as `id`, at `timestamp`, with `secret`.
fn signed(secret: &str, id: &str, timestamp: u64, body: &[u8]) -> Vec<(&'static str, String)> {
    let key = BASE64.decode(secret.trim_start_matches("whsec_")).unwrap();
    let mut message = format!("{id}.{timestamp}.").into_bytes();
    message.extend_from_slice(body);
    let signature = BASE64.encode(runlease_tests::webhooks::hmac_sha256(&key, &message));
    vec![
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", format!("v1,{signature}")),
    ]
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

/// A push as the coordinator makes it, around a lease the test holds.
fn push_body(lease: &Lease, payload: Value, coordinator: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "job": {"id": lease.job_id, "queue": lease.queue, "payload": payload, "attempt": lease.attempt,
                "max_attempts": 3, "progress": null},
        "lease": {"lease_token": lease.lease_token, "run_lease": lease.run_lease, "lease_ttl_ms": 15_000,
                  "heartbeat_interval_ms": 5_000},
        "coordinator_url": coordinator,
    }))
    .unwrap()
}

/// POSTs `body` with `headers` to the endpoint: its status and body.
async fn post(url: &str, body: &[u8], headers: &[(&'static str, String)]) -> (u16, String) {
    let mut rb = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (k, v) in headers {
        rb = rb.header(*k, v);
    }
    let r = rb.send().await.expect("the endpoint answers");
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Short jobs done in the answer, a job that can never run failed without
/// a retry, a long one handed off with 202, heartbeated and completed.
async fn serves_the_answers(api: &Api) {
    let short = enqueue_all(api, (0..5).map(|i| json!({"name": format!("n{i}")})).collect()).await;
    for (i, job) in short.iter().enumerate() {
        let job = terminal(api, job).await;
        assert_eq!(job.state, JobState::Done, "{job:?}");
        assert_eq!(job.result, Some(json!({"greeting": format!("hello, n{i}")})));
        assert_eq!((job.attempt, job.attempts.len()), (1, 1), "{job:?}");
    }

    let bad = api.enqueue_attempts(QUEUE, json!({"name": 5}), 3).await;
    let bad = terminal(api, bad.id).await;
    assert_eq!(bad.state, JobState::Failed, "{bad:?}");
    assert_eq!(bad.attempt, 1, "runlease-no-retry: no second attempt: {bad:?}");
    assert!(
        bad.error
            .as_deref()
            .unwrap_or("")
            .contains("payload.name must be a string"),
        "{bad:?}"
    );

    let long = api.enqueue(QUEUE, json!({"pages": 4, "page_ms": 400})).await;
    // Running with a checkpoint: the function heartbeats it after the 202.
    let seen = until(api, long.id, "a heartbeat's progress while running", |j| {
        j.state == JobState::Running && j.progress.as_ref().is_some_and(|p| p["page"].as_i64() >= Some(1))
    })
    .await;
    assert_eq!(seen.attempt, 1);
    let long = terminal(api, long.id).await;
    assert_eq!(long.state, JobState::Done, "{long:?}");
    assert_eq!(long.result, Some(json!({"pages": 4})));
    assert_eq!(long.progress, Some(json!({"page": 4})));
    assert_eq!(
        long.attempts.len(),
        1,
        "one attempt, finished by the function: {long:?}"
    );
    let handed_off = format!("runlease_endpoint_requests_total{{queue=\"{QUEUE}\",outcome=\"handed_off\"}}");
    assert_eq!(api.metric(&handed_off).await, 1.0);
}

/// Enqueues each payload on the endpoint's queue; answers the job ids.
async fn enqueue_all(api: &Api, payloads: Vec<Value>) -> Vec<runlease_protocol::JobId> {
    let mut ids = Vec::new();
    for p in payloads {
        ids.push(api.enqueue(QUEUE, p).await.id);
    }
    ids
}

/// Requests the test makes itself around a real lease of a pulled job: a
/// forged signature and a stale timestamp are refused by the library and
/// change nothing; the same request signed now runs the job to done; sent
/// again (a replay), the endpoint runs it again, and the coordinator
/// refuses its heartbeat with the ended lease.
async fn refuses_forged_and_stale_and_fences_a_replay(api: &Api, endpoint: &str, secret: &str) {
    let job = api.enqueue(PULLED, json!({"pages": 1, "page_ms": 10})).await;
    let lease = api.claim(PULLED, "test", 1).await.remove(0);
    assert_eq!(lease.job_id, job.id);
    let body = push_body(&lease, json!({"pages": 1, "page_ms": 10}), api.base());
    let id = format!("{}:{}", lease.job_id, lease.run_lease);

    let other = format!("whsec_{}", BASE64.encode([7u8; 32]));
    let forged = post(endpoint, &body, &signed(&other, &id, now_s(), &body)).await;
    assert_eq!(forged.0, 401, "a signature of another key: {forged:?}");
    let mut tampered = body.clone();
    let at = tampered.len() - 2;
    tampered[at] = b' ';
    let changed = post(endpoint, &tampered, &signed(secret, &id, now_s(), &body)).await;
    assert_eq!(changed.0, 401, "a body changed after signing: {changed:?}");
    let stale = post(endpoint, &body, &signed(secret, &id, now_s() - 600, &body)).await;
    assert_eq!(stale.0, 401, "a timestamp 10 minutes old: {stale:?}");
    assert!(stale.1.to_lowercase().contains("too old"), "{stale:?}");
    let unsigned = post(endpoint, &body, &[]).await;
    assert_eq!(unsigned.0, 401, "{unsigned:?}");
    // Nothing reached the coordinator: the job is running, unfinished.
    let still = api.job(job.id).await;
    assert_eq!(
        (still.state, still.attempt, still.progress.clone()),
        (JobState::Running, 1, None),
        "{still:?}"
    );

    // The same request signed now: 202, and the function completes the job.
    let headers = signed(secret, &id, now_s(), &body);
    let fresh = post(endpoint, &body, &headers).await;
    assert_eq!(fresh.0, 202, "{fresh:?}");
    let done = terminal(api, job.id).await;
    assert_eq!(
        (done.state, done.result.clone()),
        (JobState::Done, Some(json!({"pages": 1})))
    );

    // Replayed as it was (within the library's 5 minutes): the endpoint
    // takes it, but its heartbeat carries an ended lease: refused, nothing
    // changes.
    let lost = "runlease_lease_lost_total{action=\"heartbeat\"}";
    let before = api.metric(lost).await;
    let replay = post(endpoint, &body, &headers).await;
    assert_eq!(replay.0, 202, "{replay:?}");
    api.until_metric(lost, "the replay's heartbeat refused", |v| v > before)
        .await;
    let after = api.job(job.id).await;
    assert_eq!(after.state, JobState::Done);
    assert_eq!(after.result, done.result);
    assert_eq!(after.attempts.len(), done.attempts.len(), "{after:?}");
    assert_eq!(after.finished_at, done.finished_at);
}

#[tokio::test]
async fn edge_cloudflare_worker_in_workerd_verifies_answers_and_hands_long_jobs_off() {
    let db = TestDb::new().await;
    let c = coordinator(&db, Duration::from_secs(3600)).await;
    let (port, secret) = endpoint_on_a_free_port(&c.api).await;
    let worker = Endpoint::workerd(&secret, port).await;
    serves_the_answers(&c.api).await;
    refuses_forged_and_stale_and_fences_a_replay(&c.api, &worker.url, &secret).await;
}

#[tokio::test]
async fn edge_deno_handler_in_deno_verifies_answers_and_hands_long_jobs_off() {
    let db = TestDb::new().await;
    let c = coordinator(&db, Duration::from_secs(3600)).await;
    let (port, secret) = endpoint_on_a_free_port(&c.api).await;
    let handler = Endpoint::deno(&secret, port).await;
    serves_the_answers(&c.api).await;
    refuses_forged_and_stale_and_fences_a_replay(&c.api, &handler.url, &secret).await;
}

#[tokio::test]
async fn edge_lambda_function_in_python_verifies_answers_and_hands_long_jobs_off() {
    let db = TestDb::new().await;
    let c = coordinator(&db, Duration::from_secs(3600)).await;
    let (port, secret) = endpoint_on_a_free_port(&c.api).await;
    let function = Endpoint::lambda(&secret, port).await;
    serves_the_answers(&c.api).await;
    refuses_forged_and_stale_and_fences_a_replay(&c.api, &function.url, &secret).await;
}

/// A rotation: a Worker holding the old secret and one holding the new one
/// both verify during the window; after it, the old one refuses (401) and
/// the job fails as an answer of 401 does, while the new one serves on.
#[tokio::test]
async fn edge_key_rotation_verifies_with_both_secrets_during_the_window_and_only_the_new_after() {
    const WINDOW: Duration = Duration::from_secs(6);
    let db = TestDb::new().await;
    let c = coordinator(&db, WINDOW).await;
    let api = &c.api;
    let (old_port, old_secret) = endpoint_on_a_free_port(api).await;
    let old = Endpoint::workerd(&old_secret, old_port).await;
    let new_port = free_port();

    let (status, rotated) = api
        .post(&format!("/v1/queues/{QUEUE}/endpoint-secret/rotate"), &json!({}))
        .await;
    let rotated_at = Instant::now();
    assert_eq!(status, 200, "{rotated}");
    let new_secret = rotated["secret"].as_str().unwrap().to_owned();
    assert_ne!(new_secret, old_secret);
    assert_eq!(rotated["previous_secret"], json!(old_secret.as_str()));
    let new = Endpoint::workerd(&new_secret, new_port).await;

    // During the window: each Worker verifies with its own secret.
    for endpoint in [&old, &new] {
        set_endpoint(api, &endpoint.url).await;
        let job = api.enqueue(QUEUE, json!({"name": "rotating"})).await;
        let job = terminal(api, job.id).await;
        assert_eq!(
            job.state,
            JobState::Done,
            "{} during the window: {job:?}",
            endpoint.url
        );
    }
    assert!(
        rotated_at.elapsed() < WINDOW,
        "the window ran out before both were tried ({:?}): raise WINDOW",
        rotated_at.elapsed()
    );

    // After it: the previous secret no longer signs.
    let started = Instant::now();
    while !secret(api).await["previous_secret"].is_null() {
        assert!(started.elapsed() < WINDOW * 3, "the previous secret still signs");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    set_endpoint(api, &old.url).await;
    let refused = api.enqueue_attempts(QUEUE, json!({"name": "late"}), 1).await;
    let refused = terminal(api, refused.id).await;
    assert_eq!(refused.state, JobState::Failed, "{refused:?}");
    assert!(
        refused.error.as_deref().unwrap_or("").contains("401"),
        "{refused:?}"
    );
    set_endpoint(api, &new.url).await;
    let job = api.enqueue(QUEUE, json!({"name": "after"})).await;
    let job = terminal(api, job.id).await;
    assert_eq!(job.state, JobState::Done, "the new secret serves on: {job:?}");
}
