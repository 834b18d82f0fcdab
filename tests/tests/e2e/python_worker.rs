//! `examples/python_worker.py`, a Python worker on the `runlease` library
//! (`sdk/python`), drives jobs to their end: it completes, fails (at once and
//! after a retry), saves progress through heartbeats, acknowledges a cancel,
//! drops a lease it lost, and on SIGTERM releases what it holds and exits 0;
//! `examples/python_producer.py` enqueues a batch and waits for its results.
//! Both run in the library's test environment (`sdk_python::venv_bin`: a
//! virtual environment made from its metadata, as `scripts/test` makes it).
//! `examples/plain_http/python_worker.py`, the same worker written against
//! the HTTP protocol with the standard library only, runs the same course
//! under the machine's `python3`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use runlease_protocol::{Job, JobState};
use runlease_tests::api::{terminal, until};
use runlease_tests::{Api, TestCoordinator, TestDb};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use uuid::Uuid;

use crate::expire_leases;
use crate::reaping::reaper;

const QUEUE: &str = "py";

fn example(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    assert!(path.exists(), "{} is missing", path.display());
    path
}

fn worker_script() -> PathBuf {
    example("python_worker.py")
}

/// The Python that has the library installed.
fn python() -> PathBuf {
    crate::sdk_python::venv_bin().join("python")
}

async fn enqueue(api: &Api, payload: Value, max_attempts: i32) -> Job {
    api.enqueue_attempts(QUEUE, payload, max_attempts).await
}

#[tokio::test]
async fn the_python_worker_drives_jobs_to_their_end_over_plain_http() {
    drives_jobs_to_their_end(python(), worker_script()).await;
}

/// `examples/plain_http/python_worker.py`, the checklist kept by hand with
/// the standard library only (the container demo's worker), under the
/// machine's own `python3`: the same run as the library's example.
#[tokio::test]
async fn the_plain_http_python_worker_drives_jobs_to_their_end_with_the_standard_library_only() {
    drives_jobs_to_their_end(PathBuf::from("python3"), example("plain_http/python_worker.py")).await;
}

async fn drives_jobs_to_their_end(python: PathBuf, script: PathBuf) {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.leases.ttl = std::time::Duration::from_millis(3_000);
        cfg.leases.heartbeat_interval = std::time::Duration::from_millis(200);
    })
    .await;
    let api = &c.api;

    let mut worker = Command::new(&python)
        .arg(&script)
        .args(["--url", api.base(), "--queue", QUEUE, "--worker-id", "py-worker"])
        .args(["--concurrency", "8", "--wait-ms", "500", "--grace-ms", "300"])
        .env_remove("RUNLEASE_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{} runs {}: {e}", python.display(), script.display()));
    let mut stderr = worker.stderr.take().unwrap();
    let log = tokio::spawn(async move {
        let mut text = String::new();
        stderr.read_to_string(&mut text).await.unwrap();
        text
    });

    let plain = enqueue(api, json!({"n": 1}), 4).await;
    let fatal = enqueue(api, json!({"fail": "boom", "retryable": false}), 4).await;
    let flaky = enqueue(api, json!({"fail": "flaky"}), 2).await;
    let slow = enqueue(api, json!({"sleep_ms": 600}), 4).await;
    let cancelled = enqueue(api, json!({"sleep_ms": 60_000}), 4).await;
    let lost = enqueue(api, json!({"sleep_ms": 60_000}), 4).await;

    // Heartbeats carry the handler's checkpoints while it runs.
    let has_progress = |j: &Job| j.state == JobState::Running && j.progress.is_some();
    until(api, cancelled.id, "progress", has_progress).await;
    until(api, lost.id, "progress", has_progress).await;

    // A cancel reaches the handler through its heartbeat; the worker acknowledges.
    let (status, body) = api
        .post(&format!("/v1/jobs/{}/cancel", cancelled.id), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    // The lease of `lost` expires and is reaped: its heartbeat answers lease_lost.
    // (The reaper is made first: between the expiry and the pass, a
    // heartbeat may renew the lease, and the loop tries again.)
    let reaper = reaper(&db).await;
    loop {
        expire_leases(&db, &[lost.id.0]).await;
        if reaper.run_once().await.unwrap().total() == 1 {
            break;
        }
    }

    let job = terminal(api, plain.id).await;
    assert_eq!(job.state, JobState::Done);
    assert_eq!(job.result.as_ref().unwrap()["echo"], json!({"n": 1}));
    assert_eq!(job.attempts[0].worker_id.as_str(), "py-worker");

    let job = terminal(api, fatal.id).await;
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.error.as_deref(), Some("boom"));
    assert_eq!(job.attempts.len(), 1, "not retryable: one attempt");

    let job = terminal(api, flaky.id).await;
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.attempts.len(), 2, "retried once, then out of attempts");

    let job = terminal(api, slow.id).await;
    assert_eq!(job.state, JobState::Done);
    // Checkpoints travel with heartbeats (every 200 ms here); a complete carries none.
    let slept = job.progress.as_ref().and_then(|p| p["slept_ms"].as_i64());
    assert!(slept.is_some_and(|ms| ms > 0), "{job:?}");

    let job = terminal(api, cancelled.id).await;
    assert_eq!(job.state, JobState::Cancelled);
    let last = job.attempts.last().unwrap();
    assert_eq!(last.outcome.map(|o| o.as_str()), Some("cancelled"), "{job:?}");

    // The lost job was taken back, claimed again, and runs under a new lease.
    let job = until(api, lost.id, "a second lease", |j| {
        j.state == JobState::Running && j.run_lease.0 == 2
    })
    .await;
    assert_eq!(job.attempts[0].outcome.map(|o| o.as_str()), Some("lease_expired"));

    // SIGTERM: stop claiming, release what is held (with its checkpoint), exit 0.
    let pid = worker.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(Duration::from_secs(15), worker.wait())
        .await
        .expect("the worker did not stop within 15 s of SIGTERM")
        .unwrap();
    let log = log.await.unwrap();
    assert!(exit.success(), "worker exited {exit:?}; its log:\n{log}");

    let job = api.job(lost.id).await;
    assert_eq!(job.state, JobState::Queued, "{job:?}");
    assert_eq!(
        job.attempts.last().unwrap().outcome.map(|o| o.as_str()),
        Some("released")
    );
    assert!(job.progress.is_some(), "the release kept the checkpoint");

    // What the worker said it did, one JSON line per event.
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let saw = |msg: &str, id: Uuid| {
        events
            .iter()
            .any(|e| e["msg"] == msg && e["job_id"] == id.to_string())
    };
    assert!(saw("cancel requested", cancelled.id.0), "{log}");
    assert!(saw("lease lost", lost.id.0), "{log}");
    assert!(saw("job dropped", lost.id.0), "{log}");
    assert!(saw("job released", lost.id.0), "{log}");
    assert!(events.iter().any(|e| e["msg"] == "worker stopped"), "{log}");
    c.stop().await.unwrap();
}

#[tokio::test]
async fn the_python_worker_sends_its_key_and_stops_with_an_error_when_refused() {
    const WORKER_KEY: &str = "python-worker-key-0123456789";
    const PRODUCER_KEY: &str = "python-producer-key-0123456789";
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.keys.api_keys = Some(format!("worker:{WORKER_KEY},producer:{PRODUCER_KEY}"));
    })
    .await;
    let producer = c.api.with_key(PRODUCER_KEY);
    let job = enqueue(&producer, json!({"n": 2}), 4).await;

    let run = |key: &str| {
        let mut cmd = Command::new(python());
        cmd.arg(worker_script())
            .args(["--url", c.api.base(), "--queue", QUEUE, "--wait-ms", "200"])
            .env("RUNLEASE_KEY", key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        cmd.spawn()
            .expect("the test environment's python runs examples/python_worker.py")
    };

    // A wrong key: the claim is refused (401) and the worker exits 1.
    let mut refused = run("not-a-key-of-this-coordinator");
    let exit = tokio::time::timeout(Duration::from_secs(15), refused.wait())
        .await
        .expect("a refused worker must stop by itself")
        .unwrap();
    assert_eq!(exit.code(), Some(1));

    // The worker key (from RUNLEASE_KEY): the job is done.
    let mut worker = run(WORKER_KEY);
    let done = terminal(&producer, job.id).await;
    assert_eq!(done.state, JobState::Done);

    // The producer example (with the producer key): a batch of three, each
    // waited for and printed with its result; a worker key is refused.
    let produce = |key: &str| {
        Command::new(python())
            .arg(example("python_producer.py"))
            .args([
                "--url",
                c.api.base(),
                "--queue",
                QUEUE,
                "--payload",
                r#"{"greet": "Ada"}"#,
            ])
            .args(["--count", "3", "--wait", "--timeout", "15"])
            .env("RUNLEASE_KEY", key)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
    };
    let out = tokio::time::timeout(Duration::from_secs(30), produce(PRODUCER_KEY))
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
    let out = produce(WORKER_KEY).await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    let refused: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert_eq!(refused["code"], "forbidden", "{refused}");
    worker.kill().await.unwrap();
    c.stop().await.unwrap();
}
