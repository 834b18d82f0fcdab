//! `examples/typescript_worker`, a TypeScript worker on the `runlease` library
//! (`sdk/typescript`), drives jobs to their end: every job of a batch is
//! done exactly once, failures are retried or not as asked, checkpoints travel
//! with heartbeats, a cancel stops its handler, a lost lease is dropped, a
//! worker cut off from the coordinator fences itself and sends nothing,
//! concurrency is bounded, claims ride `POST /v1/finish` requests with the
//! outcomes, and on SIGTERM it stops claiming, finishes or releases what it
//! holds, and exits 0. Its producer enqueues a batch and waits for results.
//!
//! The example is built here (the library first, as `sdk_typescript` builds
//! it; then `npm ci` when the example's `node_modules` does not match its
//! `package-lock.json`, and `tsc` into its ignored `dist/`), as `scripts/test`
//! builds it beforehand. Node.js 20 or later and npm must be on
//! PATH: without them these tests fail, they never skip.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use runlease_coordinator::metrics::Metrics;
use runlease_coordinator::reaper::Reaper;
use runlease_coordinator::wake::Wake;
use runlease_protocol::{Job, JobState};
use runlease_tests::api::{terminal, until};
use runlease_tests::{Api, Proxy, TestCoordinator, TestDb};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;
use uuid::Uuid;

use crate::{attempts_with, expire_leases};

const QUEUE: &str = "ts";

/// The example's directory.
fn example_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/typescript_worker");
    assert!(dir.join("package.json").exists(), "{} is missing", dir.display());
    dir
}

/// Runs `program args` in `dir`, failing the test with its output if it fails.
fn run(dir: &Path, program: &str, args: &[&str]) {
    runlease_tests::process::run_tool(
        dir,
        program,
        args,
        "(Node.js 20 or later and npm) to build the TypeScript worker",
    );
}

/// Builds the worker (once per test process) and answers its entry point,
/// `dist/worker.js`.
fn worker_script() -> PathBuf {
    static SCRIPT: OnceLock<PathBuf> = OnceLock::new();
    SCRIPT.get_or_init(build).clone()
}

/// The newest modification time of `path`, a file or a directory tree.
pub(crate) fn newest(path: &Path) -> SystemTime {
    let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut at = meta.modified().unwrap();
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).unwrap() {
            at = at.max(newest(&entry.unwrap().path()));
        }
    }
    at
}

/// The same steps as scripts/test: `npm ci` unless `node_modules` was
/// installed from this very `package-lock.json` (its copy there is the
/// stamp), then `tsc` unless `dist/worker.js` is newer than its inputs. Test
/// processes build one at a time (a file lock beside the test binaries), so
/// none runs `npm ci` under another's feet.
fn build() -> PathBuf {
    // The example depends on the library by path (`file:../../sdk/typescript`): its dist/ first.
    let sdk = crate::sdk_typescript::built();
    let dir = example_dir();
    let version = std::process::Command::new("node")
        .arg("--version")
        .output()
        .expect("node must be on PATH (Node.js 20 or later) to run examples/typescript_worker");
    let version = String::from_utf8_lossy(&version.stdout).trim().to_owned();
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    assert!(
        major >= 20,
        "examples/typescript_worker needs Node.js 20 or later, found {version:?}"
    );

    let exe = std::env::current_exe().unwrap();
    let lock = File::create(exe.parent().unwrap().join("typescript_worker.build.lock")).unwrap();
    lock.lock().unwrap();
    let lockfile = std::fs::read(dir.join("package-lock.json")).expect("package-lock.json is committed");
    let stamp = dir.join("node_modules/.runlease-package-lock.json");
    if std::fs::read(&stamp).ok().as_deref() != Some(lockfile.as_slice()) {
        run(&dir, "npm", &["ci", "--no-audit", "--no-fund"]);
        std::fs::write(&stamp, &lockfile).unwrap();
    }
    let script = dir.join("dist/worker.js");
    let inputs = [
        "src",
        "tsconfig.json",
        "package.json",
        "node_modules/.runlease-package-lock.json",
    ]
    .iter()
    .map(|p| newest(&dir.join(p)))
    .chain([newest(&sdk.join("dist"))])
    .max()
    .unwrap();
    let built = std::fs::metadata(&script).and_then(|m| m.modified()).ok();
    if built.is_none_or(|at| at <= inputs) {
        run(&dir, "npm", &["run", "--silent", "build"]);
    }
    drop(lock);
    assert!(script.exists(), "{} is missing after the build", script.display());
    script
}

/// The worker as a child process, and what it logged (one JSON line per event).
struct TsWorker {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<Value>,
}

impl TsWorker {
    fn start(url: &str, args: &[&str], key: Option<&str>) -> Self {
        let mut cmd = Command::new("node");
        cmd.arg(worker_script())
            .args(["--url", url, "--queue", QUEUE])
            .args(args)
            .env_remove("RUNLEASE_KEY")
            .env_remove("RUNLEASE_QUEUES")
            .env_remove("RUNLEASE_WORKER_ID")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(key) = key {
            cmd.env("RUNLEASE_KEY", key);
        }
        let mut child = cmd
            .spawn()
            .expect("node must be on PATH to run examples/typescript_worker");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    fn take(&mut self, line: String) -> Value {
        // A line that is not JSON (a crash's stack trace) is kept as text and
        // fails `every_line_was_json`.
        let event = serde_json::from_str(&line).unwrap_or(Value::String(line));
        self.seen.push(event.clone());
        event
    }

    /// Waits (15 s at most) for the next logged event that `pred` accepts.
    async fn event(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let found = tokio::time::timeout(Duration::from_secs(15), async {
            while let Some(line) = self.lines.recv().await {
                let event = self.take(line);
                if pred(&event) {
                    return Some(event);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(event)) => event,
            Ok(None) => panic!(
                "the worker exited before logging {what}; its log:\n{}",
                self.log()
            ),
            Err(_) => panic!(
                "the worker did not log {what} within 15 s; its log:\n{}",
                self.log()
            ),
        }
    }

    /// Waits for `msg` about job `id`.
    async fn job_event(&mut self, msg: &str, id: Uuid) -> Value {
        let id = id.to_string();
        self.event(&format!("{msg:?} for job {id}"), |e| {
            e["msg"] == msg && e["job_id"] == id
        })
        .await
    }

    /// Whether `msg` about job `id` was logged so far.
    fn saw(&self, msg: &str, id: Uuid) -> bool {
        let id = id.to_string();
        self.seen.iter().any(|e| e["msg"] == msg && e["job_id"] == id)
    }

    fn log(&self) -> String {
        self.seen.iter().map(|e| format!("{e}\n")).collect()
    }

    /// Sends SIGTERM.
    fn terminate(&self) {
        let pid = self.child.id().expect("the worker is running").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {pid}");
    }

    /// Waits (15 s at most) for the worker to exit, then reads the rest of its log.
    async fn exited(&mut self) -> ExitStatus {
        let status = tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the worker did not exit within 15 s; its log:\n{}", self.log()))
            .unwrap();
        while let Some(line) = self.lines.recv().await {
            self.take(line);
        }
        status
    }

    fn every_line_was_json(&self) {
        for e in &self.seen {
            assert!(
                e.is_object(),
                "not a JSON event line: {e}\nits log:\n{}",
                self.log()
            );
        }
    }
}

impl Drop for TsWorker {
    /// A test that fails shows what the worker said up to then.
    fn drop(&mut self) {
        if std::thread::panicking() {
            while let Ok(line) = self.lines.try_recv() {
                self.take(line);
            }
            eprintln!("the TypeScript worker's log:\n{}", self.log());
        }
    }
}

async fn enqueue(api: &Api, payload: Value, max_attempts: i32) -> Job {
    api.enqueue_attempts(QUEUE, payload, max_attempts).await
}

/// Successful POSTs to `route` this coordinator answered.
async fn posts(api: &Api, route: &str) -> f64 {
    api.metric(&format!(
        "runlease_request_duration_seconds_count{{route=\"{route}\",method=\"POST\",status=\"2xx\"}}"
    ))
    .await
}

/// Expires the lease of job `id` and reaps it, as if its worker had stopped
/// heartbeating a TTL ago. A heartbeat that lands between the two renews
/// the lease: then again (the reaper and its pool are made once, so the gap
/// between the two is short).
async fn reap_lease(db: &TestDb, id: Uuid) {
    let reaper = Reaper::new(
        db.store().await,
        Arc::new(Metrics::new(Duration::from_secs(25))),
        Wake::local_only(),
        Duration::from_secs(1),
    );
    for _ in 0..100 {
        expire_leases(db, &[id]).await;
        reaper.run_once().await.unwrap();
        if attempts_with(db, id, "lease_expired").await == 1 {
            return;
        }
    }
    panic!("the lease of job {id} was renewed before every reap");
}

fn outcomes(job: &Job) -> Vec<Option<&'static str>> {
    job.attempts
        .iter()
        .map(|a| a.outcome.map(|o| o.as_str()))
        .collect()
}

#[tokio::test]
async fn the_typescript_worker_drives_jobs_to_their_end_over_plain_http() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        // Long enough that a loaded machine does not expire leases by itself
        // (this test expires the one it means to); beats come every 200 ms.
        cfg.leases.ttl = std::time::Duration::from_millis(10_000);
        cfg.leases.heartbeat_interval = std::time::Duration::from_millis(200);
    })
    .await;
    let api = &c.api;
    let mut worker = TsWorker::start(
        api.base(),
        &[
            "--worker-id",
            "ts-worker",
            "--concurrency",
            "8",
            "--wait-ms",
            "500",
            "--grace-ms",
            "2000",
        ],
        None,
    );
    worker
        .event("worker started", |e| e["msg"] == "worker started")
        .await;

    // A batch lands at once: the parked claim takes up to its free slots, and
    // the outcomes of jobs that end together share finish requests.
    let batch: Vec<Value> = (0..20)
        .map(|n| json!({"queue": QUEUE, "payload": {"n": n}}))
        .collect();
    let (status, body) = api.post("/v1/jobs/batch", &json!({"jobs": batch})).await;
    assert_eq!(status, 201, "{body}");
    let batch: Vec<Job> = serde_json::from_value(body["jobs"].clone()).unwrap();
    let fatal = enqueue(api, json!({"fail": "boom", "retryable": false}), 4).await;
    let flaky = enqueue(api, json!({"fail": "flaky"}), 2).await;
    let slow = enqueue(api, json!({"sleep_ms": 600}), 4).await;
    let cancelled = enqueue(api, json!({"sleep_ms": 60_000}), 4).await;
    let lost = enqueue(api, json!({"sleep_ms": 60_000}), 4).await;

    // Every job of the batch is done exactly once: one attempt, completed.
    for (n, job) in batch.iter().enumerate() {
        let done = terminal(api, job.id).await;
        assert_eq!(done.state, JobState::Done, "{done:?}");
        assert_eq!(done.result.as_ref().unwrap()["echo"], json!({"n": n}));
        assert_eq!(done.run_lease.0, 1, "{done:?}");
        assert_eq!(outcomes(&done), vec![Some("completed")], "{done:?}");
        assert_eq!(done.attempts[0].worker_id.as_str(), "ts-worker");
        assert_eq!(attempts_with(&db, job.id.0, "completed").await, 1);
    }

    // Heartbeats carry the handler's checkpoints while it runs.
    let has_progress = |j: &Job| j.state == JobState::Running && j.progress.is_some();
    until(api, cancelled.id, "progress", has_progress).await;
    until(api, lost.id, "progress", has_progress).await;

    // A cancel reaches the handler through its heartbeat; the worker fails
    // the attempt, not retryable, and the coordinator records `cancelled`.
    let (status, body) = api
        .post(&format!("/v1/jobs/{}/cancel", cancelled.id), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    // The lease of `lost` expires and is reaped: its heartbeat answers
    // lease_lost, and the worker drops the job without a word.
    reap_lease(&db, lost.id.0).await;

    let job = terminal(api, fatal.id).await;
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error.as_deref(), Some("boom"));
    assert_eq!(job.attempts.len(), 1, "not retryable: one attempt");

    let job = terminal(api, flaky.id).await;
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        outcomes(&job),
        vec![Some("failed"), Some("failed")],
        "retried once, then out of attempts"
    );

    let job = terminal(api, slow.id).await;
    assert_eq!(job.state, JobState::Done);
    // Checkpoints travel with heartbeats (every 200 ms here); a complete carries none.
    let slept = job.progress.as_ref().and_then(|p| p["slept_ms"].as_i64());
    assert!(slept.is_some_and(|ms| ms > 0), "{job:?}");

    let job = terminal(api, cancelled.id).await;
    assert_eq!(job.state, JobState::Cancelled);
    assert_eq!(outcomes(&job), vec![Some("cancelled")], "{job:?}");
    worker.job_event("cancel requested", cancelled.id.0).await;

    // The lost job was taken back, claimed again, and runs under a new lease.
    worker.job_event("lease lost", lost.id.0).await;
    let dropped = worker.job_event("job dropped", lost.id.0).await;
    assert_eq!(dropped["reason"], "lease_lost");
    let job = until(api, lost.id, "a second lease", |j| {
        j.state == JobState::Running && j.run_lease.0 == 2
    })
    .await;
    assert_eq!(
        outcomes(&job)[0],
        Some("lease_expired"),
        "nothing was sent for the lost lease"
    );

    // Outcomes and claims went through /v1/finish (a claim rides each one;
    // an idle worker's long-poll is a finish without items).
    assert!(posts(api, "/v1/finish").await > 0.0);
    for route in ["/v1/claim", "/v1/complete", "/v1/fail", "/v1/release"] {
        assert_eq!(posts(api, route).await, 0.0, "{route} is not used");
    }
    // Twenty jobs over eight slots: the slots the first outcomes freed were
    // claimed again by the finish requests that carried them.
    let rode = |e: &Value| e["msg"] == "job claimed" && e["via"] == "finish";
    if !worker.seen.iter().any(rode) {
        worker.event("a lease that rode on a finish", rode).await;
    }

    // SIGTERM with a short job in flight: it finishes within the grace and
    // is completed; the long one is stopped and released with its checkpoint.
    let finishing = enqueue(api, json!({"sleep_ms": 500}), 4).await;
    until(api, finishing.id, "a lease", |j| j.state == JobState::Running).await;
    worker.terminate();
    worker
        .event("the signal", |e| e["msg"] == "signal received; stopping")
        .await;
    // Claiming has stopped: a claim that was parked may still answer, and what
    // it brings is given back at once.
    let late = enqueue(api, json!({"sleep_ms": 60_000}), 4).await;
    let exit = worker.exited().await;
    assert!(
        exit.success(),
        "worker exited {exit:?}; its log:\n{}",
        worker.log()
    );
    worker.every_line_was_json();

    let job = api.job(finishing.id).await;
    assert_eq!(job.state, JobState::Done, "finished within the grace: {job:?}");
    let job = api.job(lost.id).await;
    assert_eq!(job.state, JobState::Queued, "{job:?}");
    assert_eq!(outcomes(&job), vec![Some("lease_expired"), Some("released")]);
    assert!(job.progress.is_some(), "the release kept the checkpoint");
    // Given back by the worker, or (when the worker had already dropped its
    // parked claim) by the coordinator once it sees the claimer gone: either
    // way released, never left to expire.
    let job = until(api, late.id, "given back", |j| j.state == JobState::Queued).await;
    assert!(
        outcomes(&job).iter().all(|o| *o == Some("released")),
        "a job claimed while draining is released at once: {job:?}"
    );
    assert_eq!(job.attempt, 0, "no attempt charged: {job:?}");

    assert!(worker.saw("job released", lost.id.0), "{}", worker.log());
    assert!(worker.saw("job completed", finishing.id.0), "{}", worker.log());
    assert!(
        worker.seen.iter().any(|e| e["msg"] == "worker stopped"),
        "{}",
        worker.log()
    );
    c.stop().await.unwrap();
}

#[tokio::test]
async fn the_typescript_worker_sends_its_key_runs_at_most_its_concurrency_and_stops_when_refused() {
    const WORKER_KEY: &str = "typescript-worker-key-0123456789";
    const PRODUCER_KEY: &str = "typescript-producer-key-0123456789";
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.api_keys = Some(format!("worker:{WORKER_KEY},producer:{PRODUCER_KEY}"));
    })
    .await;
    let producer = c.api.with_key(PRODUCER_KEY);
    let batch: Vec<Value> = (0..6)
        .map(|n| json!({"queue": QUEUE, "payload": {"sleep_ms": 200, "n": n}}))
        .collect();
    let (status, body) = producer.post("/v1/jobs/batch", &json!({"jobs": batch})).await;
    assert_eq!(status, 201, "{body}");
    let jobs: Vec<Job> = serde_json::from_value(body["jobs"].clone()).unwrap();

    // A wrong key: the claim is refused (401) and the worker exits 1.
    let mut refused = TsWorker::start(
        c.api.base(),
        &["--wait-ms", "200"],
        Some("not-a-key-of-this-coordinator"),
    );
    let exit = refused.exited().await;
    assert_eq!(exit.code(), Some(1), "its log:\n{}", refused.log());
    assert!(
        refused.seen.iter().any(|e| e["msg"] == "claim refused; stopping"),
        "{}",
        refused.log()
    );

    // The worker key (from RUNLEASE_KEY): every job is done, never more than
    // two at once (by the attempts' chronology, PostgreSQL's clock).
    let mut worker = TsWorker::start(
        c.api.base(),
        &["--wait-ms", "200", "--concurrency", "2"],
        Some(WORKER_KEY),
    );
    let mut spans = Vec::new();
    for job in &jobs {
        let done = terminal(&producer, job.id).await;
        assert_eq!(done.state, JobState::Done, "{done:?}");
        assert_eq!(done.attempts.len(), 1, "{done:?}");
        let a = &done.attempts[0];
        spans.push((a.claimed_at, a.finished_at.unwrap()));
    }
    for (claimed, _) in &spans {
        let running = spans.iter().filter(|(c, f)| c <= claimed && claimed < f).count();
        assert!(
            running <= 2,
            "{running} jobs ran at once with --concurrency 2: {spans:?}"
        );
    }

    // The producer example (with the producer key): a batch of three, each
    // waited for and printed with its result.
    let producer_js = worker_script().with_file_name("producer.js");
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        Command::new("node")
            .arg(&producer_js)
            .args([
                "--url",
                c.api.base(),
                "--queue",
                QUEUE,
                "--payload",
                r#"{"greet": "Ada"}"#,
            ])
            .args(["--count", "3", "--wait", "--timeout-ms", "15000"])
            .env("RUNLEASE_KEY", PRODUCER_KEY)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the producer example took over 30 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the producer example failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Vec<Value> = stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(printed.len(), 3, "{stdout}");
    for (n, job) in printed.iter().enumerate() {
        assert_eq!(job["state"], "done", "{stdout}");
        assert_eq!(job["result"]["echo"], json!({"greet": "Ada", "n": n}), "{stdout}");
    }
    // A worker key may not enqueue: the refusal is typed and the exit status 1.
    let out = Command::new("node")
        .arg(&producer_js)
        .args(["--url", c.api.base(), "--queue", QUEUE])
        .env("RUNLEASE_KEY", WORKER_KEY)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let refused: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(refused["code"], "forbidden", "{refused}");

    worker.terminate();
    let exit = worker.exited().await;
    assert!(
        exit.success(),
        "worker exited {exit:?}; its log:\n{}",
        worker.log()
    );
    c.stop().await.unwrap();
}

#[tokio::test]
async fn a_typescript_worker_cut_off_from_the_coordinator_fences_itself_and_sends_nothing() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.leases.ttl = std::time::Duration::from_millis(1_500);
        cfg.leases.heartbeat_interval = std::time::Duration::from_millis(250);
    })
    .await;
    let proxy = Proxy::start(c.addr).await;
    let mut worker = TsWorker::start(
        &proxy.url(),
        &["--worker-id", "cut-off", "--wait-ms", "300", "--grace-ms", "200"],
        None,
    );
    let job = enqueue(&c.api, json!({"sleep_ms": 60_000}), 4).await;
    until(&c.api, job.id, "progress", |j| j.progress.is_some()).await;

    let lease_expiry =
        "SELECT (extract(epoch FROM lease_expires_at) * 1000000)::bigint FROM jobs WHERE id = $1";
    proxy.cut();
    // No heartbeat gets through: a TTL after the last one that did, the
    // worker stops the handler and drops the job, before the coordinator
    // could consider the lease expired.
    let dropped = worker.job_event("job dropped", job.id.0).await;
    assert_eq!(dropped["reason"], "no_heartbeat", "{}", worker.log());
    // Both clocks are this machine's: the worker's log stamp (ms) against
    // PostgreSQL's expiry, allowing for a timer that fires a little late.
    let expires: i64 = db.scalar(lease_expiry, &[&job.id.0]).await;
    let fenced_at = (dropped["ts"].as_f64().unwrap() * 1_000_000.0) as i64;
    assert!(
        fenced_at <= expires + 250_000,
        "fenced {} ms after the coordinator's lease expired",
        (fenced_at - expires) / 1000
    );

    // Back in touch, the worker works on (it completes a new job), but sends
    // nothing for the fenced lease: no heartbeat renews it, no outcome lands.
    proxy.heal();
    let other = enqueue(&c.api, json!({"n": 1}), 4).await;
    assert_eq!(terminal(&c.api, other.id).await.state, JobState::Done);
    let fenced = c.api.job(job.id).await;
    assert_eq!(fenced.state, JobState::Running, "{fenced:?}");
    assert_eq!(outcomes(&fenced), vec![None], "{fenced:?}");
    assert_eq!(
        db.scalar(lease_expiry, &[&job.id.0]).await,
        expires,
        "a heartbeat renewed the fenced lease"
    );

    // The coordinator decides: the reaper takes it back.
    reap_lease(&db, job.id.0).await;
    let job = c.api.job(job.id).await;
    assert_eq!(outcomes(&job)[0], Some("lease_expired"), "{job:?}");

    worker.terminate();
    let exit = worker.exited().await;
    assert!(
        exit.success(),
        "worker exited {exit:?}; its log:\n{}",
        worker.log()
    );
    worker.every_line_was_json();
    c.stop().await.unwrap();
}
