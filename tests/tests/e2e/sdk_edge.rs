//! The edge examples on the runlease libraries (`examples/edge/sdk/`)
//! serving an endpoint queue of a real coordinator, which signs and pushes
//! every job to them:
//!
//! - the Cloudflare Worker (`sdk/cloudflare.ts`: `pushHandler` of the npm
//!   `runlease` package, sdk/typescript, linked by path and bundled with
//!   esbuild) in workerd, through miniflare;
//! - the Deno Deploy handler (`sdk/deno.ts`, the same package resolved by
//!   Deno from examples/edge's package.json) in Deno, from npm;
//! - the Lambda function URL handler (`sdk/lambda_function.py`:
//!   `PushHandler.lambda_handler` of the Python library) behind
//!   `sdk/serve_lambda.py`, which turns requests into function URL events.
//!
//! (The Vercel function is type-checked only: `npm run check`.)
//!
//! Each completes short jobs with their result; fails a job whose handler
//! throws as the endpoint table says (`JobError`/`JobFailed` not retryable:
//! failed at the first attempt; any other error: retried, then failed);
//! hands a long job off with 202 and completes it through /v1/*, its
//! checkpoints riding the library's heartbeats (the Worker under
//! ctx.waitUntil, Deno in a promise left running; the Lambda, frozen once it answers, before its 202); and
//! sees a cancel on a heartbeat (the handler stops, the job ends
//! cancelled) and a lost lease (the handler stops and sends nothing; the
//! job's next attempt resumes from its checkpoint). What they need is installed as `scripts/test` does
//! beforehand (`edge_runtimes::build_worker`, `sdk_python::venv_bin`).

use std::process::Stdio;
use std::time::Duration;

use runlease_protocol::JobState;
use runlease_tests::api::{terminal, until};
use runlease_tests::{Api, TestCoordinator, TestDb};
use serde_json::json;
use tokio::process::Command;

use crate::edge_runtimes::{Endpoint, QUEUE, edge_dir, endpoint_on_a_free_port, first_line};

/// A coordinator that may push to 127.0.0.1, with a short lease (TTL 3 s,
/// heartbeats every second) so the libraries' heartbeats after a hand-off
/// are seen within a job of a few seconds.
async fn coordinator(db: &TestDb) -> TestCoordinator {
    TestCoordinator::start_with(db, |cfg| {
        cfg.endpoints.allow_hosts = Some("127.0.0.1".to_owned());
        cfg.leases.ttl = Duration::from_millis(3_000);
        cfg.leases.heartbeat_interval = Duration::from_millis(1_000);
        cfg.leases.reaper_interval = Duration::from_millis(200);
    })
    .await
}

/// `sdk/cloudflare.ts`'s bundle in workerd on `port`.
async fn cloudflare(secret: &str, port: u16) -> Endpoint {
    Endpoint::workerd_bundle("dist/sdk-cloudflare-worker.mjs", secret, port).await
}

/// `sdk/deno.ts` in Deno on `port`.
async fn deno(secret: &str, port: u16) -> Endpoint {
    Endpoint::deno_script("sdk/deno.ts", secret, port).await
}

/// `sdk/lambda_function.py` behind `sdk/serve_lambda.py` on `port`, in the
/// Python library's environment (the package installed from sdk/python).
async fn lambda(secret: &str, port: u16) -> Endpoint {
    let python = crate::sdk_python::venv_bin().join("python");
    let mut child = Command::new(&python)
        .arg("serve_lambda.py")
        .arg(port.to_string())
        .current_dir(edge_dir().join("sdk"))
        .env("RUNLEASE_ENDPOINT_SECRET", secret)
        .env("RUNLEASE_HANDOFF_AFTER", "1")
        .env_remove("RUNLEASE_KEY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    let (said, lines) = first_line(&mut child, "serve_lambda.py").await;
    assert_eq!(said["listening"], port, "{said}");
    Endpoint {
        url: format!("http://127.0.0.1:{port}/"),
        child,
        _lines: lines,
    }
}

/// Short jobs done with their result, in one attempt each.
async fn completes_short_jobs(api: &Api) {
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(api.enqueue(QUEUE, json!({"name": format!("n{i}")})).await.id);
    }
    for (i, id) in ids.iter().enumerate() {
        let job = terminal(api, id).await;
        assert_eq!(job.state, JobState::Done, "{job:?}");
        assert_eq!(job.result, Some(json!({"greeting": format!("hello, n{i}")})));
        assert_eq!((job.attempt, job.attempts.len()), (1, 1), "{job:?}");
    }
}

/// A handler's throw: not retryable fails at once, anything else is
/// retried until the attempts run out; the error's message is kept.
async fn fails_throws_as_the_table_says(api: &Api) {
    let bad = api.enqueue_attempts(QUEUE, json!({"name": 5}), 3).await;
    let bad = terminal(api, bad.id).await;
    assert_eq!(bad.state, JobState::Failed, "{bad:?}");
    assert_eq!(bad.attempt, 1, "runlease-no-retry: no second attempt: {bad:?}");
    let error = bad.error.as_deref().unwrap_or("");
    assert!(error.contains("payload.name must be a string"), "{bad:?}");

    let boom = api.enqueue_attempts(QUEUE, json!({"fail": "boom"}), 2).await;
    let boom = terminal(api, boom.id).await;
    assert_eq!(boom.state, JobState::Failed, "{boom:?}");
    assert_eq!(
        (boom.attempt, boom.attempts.len()),
        (2, 2),
        "retried once: {boom:?}"
    );
    assert!(boom.error.as_deref().unwrap_or("").contains("boom"), "{boom:?}");
}

/// A long job: answered 202 after a second, its checkpoints seen while it
/// runs (the library's heartbeats carry them), completed through /v1/* in
/// its one attempt.
async fn hands_a_long_job_off(api: &Api) {
    let handed_off = format!("runlease_endpoint_requests_total{{queue=\"{QUEUE}\",outcome=\"handed_off\"}}");
    let before = api.metric(&handed_off).await;
    let long = api.enqueue(QUEUE, json!({"pages": 8, "page_ms": 400})).await;
    let seen = until(api, long.id, "a checkpoint on a heartbeat while running", |j| {
        j.state == JobState::Running && j.progress.as_ref().is_some_and(|p| p["page"].as_i64() >= Some(2))
    })
    .await;
    assert_eq!(seen.attempt, 1);
    let long = terminal(api, long.id).await;
    assert_eq!(long.state, JobState::Done, "{long:?}");
    assert_eq!(long.result, Some(json!({"pages": 8})));
    assert_eq!((long.attempt, long.attempts.len()), (1, 1), "{long:?}");
    api.until_metric(&handed_off, "the 202 counted as a hand-off", |v| {
        v >= before + 1.0
    })
    .await;
}

/// A cancel of a handed-off job: the next heartbeat answers
/// `cancel_requested`, the handler's signal stops it, the library
/// acknowledges with a release and the job ends cancelled, unfinished.
async fn stops_on_a_cancel(api: &Api) {
    let job = api.enqueue(QUEUE, json!({"pages": 100, "page_ms": 200})).await;
    until(api, job.id, "running, heartbeated after the hand-off", |j| {
        j.state == JobState::Running && j.progress.as_ref().is_some_and(|p| p["page"].as_i64() >= Some(6))
    })
    .await;
    let (status, body) = api.post(&format!("/v1/jobs/{}/cancel", job.id), &json!({})).await;
    assert!(status == 200 || status == 202, "{status} {body}");
    let cancelled = terminal(api, job.id).await;
    assert_eq!(cancelled.state, JobState::Cancelled, "{cancelled:?}");
    assert_eq!(cancelled.result, None);
    let page = cancelled
        .progress
        .as_ref()
        .and_then(|p| p["page"].as_i64())
        .unwrap_or(0);
    assert!((6..100).contains(&page), "stopped part way: {cancelled:?}");
}

/// A handed-off job whose lease runs out (made expired here, as if the
/// function had been unheard for a TTL): the reaper takes it back and it is
/// pushed again; the first attempt's next heartbeat is refused
/// (`lease_lost`), so that handler stops and sends nothing, and the second
/// attempt resumes from the checkpoint and completes the job.
async fn stops_when_its_lease_is_lost(api: &Api, db: &TestDb) {
    let lost = "runlease_lease_lost_total{action=\"heartbeat\"}";
    let before = api.metric(lost).await;
    let job = api.enqueue(QUEUE, json!({"pages": 20, "page_ms": 250})).await;
    until(api, job.id, "running, heartbeated after the hand-off", |j| {
        j.state == JobState::Running && j.progress.as_ref().is_some_and(|p| p["page"].as_i64() >= Some(5))
    })
    .await;
    crate::expire_leases(db, &[job.id.0]).await;
    api.until_metric(lost, "the first attempt's heartbeat refused", |v| v > before)
        .await;
    let done = terminal(api, job.id).await;
    assert_eq!(done.state, JobState::Done, "{done:?}");
    assert_eq!(done.result, Some(json!({"pages": 20})));
    assert_eq!((done.attempt, done.attempts.len()), (2, 2), "{done:?}");
    assert_eq!(crate::attempts_with(db, job.id.0, "lease_expired").await, 1);
    assert_eq!(crate::attempts_with(db, job.id.0, "completed").await, 1);
}

async fn serves_an_endpoint_queue(api: &Api, db: &TestDb) {
    completes_short_jobs(api).await;
    fails_throws_as_the_table_says(api).await;
    hands_a_long_job_off(api).await;
    stops_on_a_cancel(api).await;
    stops_when_its_lease_is_lost(api, db).await;
}

#[tokio::test]
async fn sdk_edge_cloudflare_worker_on_the_library_serves_a_real_coordinators_pushes_in_workerd() {
    let db = TestDb::new().await;
    let c = coordinator(&db).await;
    let (port, secret) = endpoint_on_a_free_port(&c.api).await;
    let _worker = cloudflare(&secret, port).await;
    serves_an_endpoint_queue(&c.api, &db).await;
}

#[tokio::test]
async fn sdk_edge_deno_handler_on_the_library_serves_a_real_coordinators_pushes_in_deno() {
    let db = TestDb::new().await;
    let c = coordinator(&db).await;
    let (port, secret) = endpoint_on_a_free_port(&c.api).await;
    let _handler = deno(&secret, port).await;
    serves_an_endpoint_queue(&c.api, &db).await;
}

#[tokio::test]
async fn sdk_edge_lambda_function_url_on_the_python_library_serves_a_real_coordinators_pushes() {
    let db = TestDb::new().await;
    let c = coordinator(&db).await;
    let (port, secret) = endpoint_on_a_free_port(&c.api).await;
    let _function = lambda(&secret, port).await;
    serves_an_endpoint_queue(&c.api, &db).await;
}
