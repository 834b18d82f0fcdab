//! Retry policies: the delays a job waits between attempts follow its own
//! backoff, else its queue's, else the coordinator's defaults, field by
//! field; the worker's retry_after_ms wins over all of them; the retry
//! window ends retries; the chronology says when each retry was planned
//! and why; bad policies are refused with 422.

use std::time::Duration;

use chrono::{DateTime, Utc};
use runlease_protocol::{Attempt, AttemptOutcome, Job, JobId, JobState, RetryReason};
use runlease_tests::{TestCoordinator, TestDb};
use serde_json::{Value, json};

use crate::expire_leases;

/// How far a planned delay may be from the policy's.
const TOLERANCE_MS: i64 = 50;

fn ms_between(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    (to - from).num_milliseconds()
}

/// Enqueues `body` (201 expected).
async fn enqueue(c: &TestCoordinator, body: Value) -> Job {
    let (status, job) = c.api.post("/v1/jobs", &body).await;
    assert_eq!(status, 201, "{job}");
    serde_json::from_value(job).unwrap()
}

/// Claims job `id` of `queue` as soon as it is claimable (polling every
/// 10 ms, 20 s at most), so its claim time is its retry time.
async fn claim_when_due(c: &TestCoordinator, queue: &str, id: JobId) -> runlease_protocol::worker::Lease {
    for _ in 0..2000 {
        if let Some(lease) = c.api.claim(queue, "w", 1).await.into_iter().next() {
            assert_eq!(lease.job_id, id, "the only job of {queue}");
            return lease;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("job {id} never became claimable on {queue}");
}

/// Fails job `id` `fails` times (retryable, no retry_after_ms), each
/// attempt claimed as soon as it is due; answers the job as it is then.
async fn fail_times(c: &TestCoordinator, queue: &str, id: JobId, fails: usize) -> Job {
    for n in 0..fails {
        let lease = claim_when_due(c, queue, id).await;
        let (status, body) = c
            .api
            .fail(&lease, &format!("failure {}", n + 1), true, None)
            .await;
        assert_eq!(status, 200, "{body}");
    }
    c.api.job(id).await
}

/// Checks that the n-th ended attempt of `job` planned its retry
/// `delays[n]` ms after it ended (within the tolerance), said why with a
/// backoff reason, and that the next attempt did not start before.
fn assert_waited(job: &Job, delays: &[i64]) {
    let a: &[Attempt] = &job.attempts;
    assert!(a.len() > delays.len(), "{a:#?}");
    for (n, expected) in delays.iter().enumerate() {
        let ended = a[n].finished_at.unwrap();
        let retry_at = a[n]
            .retry_at
            .unwrap_or_else(|| panic!("attempt {n} has no retry_at: {a:#?}"));
        let planned = ms_between(ended, retry_at);
        assert!(
            (planned - expected).abs() <= TOLERANCE_MS,
            "retry {} planned {planned} ms after the failure, policy says {expected} ms: {a:#?}",
            n + 1
        );
        let reason = a[n].retry_reason.as_deref().unwrap();
        assert_eq!(RetryReason::of(reason), Some(RetryReason::Backoff), "{reason}");
        assert!(reason.contains(&format!("backoff: {expected} ms")), "{reason}");
        let started = a[n + 1].claimed_at;
        assert!(
            started >= retry_at,
            "attempt {} started before its retry time: {a:#?}",
            n + 2
        );
        // The claim polls every 10 ms; a loaded machine may answer late.
        assert!(
            ms_between(ended, started) < expected + 1_000,
            "attempt {} waited {} ms, far past {expected} ms",
            n + 2,
            ms_between(ended, started)
        );
    }
}

#[tokio::test]
async fn a_jobs_own_backoff_sets_the_delays_it_waits() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = enqueue(
        &c,
        json!({"queue": "own", "payload": 1, "max_attempts": 4,
               "backoff": {"base_ms": 100, "max_ms": 300, "factor": 2, "jitter": 0}}),
    )
    .await;
    assert_eq!(job.backoff.unwrap().base_ms, Some(100));
    let job = fail_times(&c, "own", job.id, 3).await;
    let lease = claim_when_due(&c, "own", job.id).await;
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    let job = c.api.job(job.id).await;
    assert_eq!(job.state, JobState::Done);
    // 100, 200, then 400 capped at max_ms.
    assert_waited(&job, &[100, 200, 300]);
    // The paged chronology says the same.
    let (status, page) = c.api.get(&format!("/v1/jobs/{}/attempts", job.id)).await;
    assert_eq!(status, 200, "{page}");
    for (n, a) in job.attempts.iter().enumerate() {
        assert_eq!(
            page["attempts"][n]["retry_reason"],
            json!(a.retry_reason),
            "{page}"
        );
        assert_eq!(page["attempts"][n]["retry_at"], json!(a.retry_at), "{page}");
    }
    assert_eq!(job.attempts[3].retry_at, None, "a completion plans no retry");
    assert_eq!(job.attempts[3].retry_reason, None);
}

#[tokio::test]
async fn a_queue_policy_applies_to_jobs_enqueued_without_their_own() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let (status, body) = c
        .api
        .patch(
            "/v1/queues/qp",
            &json!({"max_attempts": 3, "backoff": {"base_ms": 150, "factor": 1, "jitter": 0},
                    "retry_window_ms": 600000}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["settings"]["max_attempts"], 3);
    assert_eq!(
        body["settings"]["backoff"],
        json!({"base_ms": 150, "factor": 1.0, "jitter": 0.0})
    );
    assert_eq!(body["settings"]["retry_window_ms"], 600000);
    let (_, shown) = c.api.get("/v1/queues/qp").await;
    assert_eq!(shown["settings"], body["settings"]);

    let job = enqueue(&c, json!({"queue": "qp", "payload": 1})).await;
    assert_eq!(job.max_attempts, 3, "the queue's budget");
    assert_eq!(job.retry_window_ms, Some(600000));
    let job = fail_times(&c, "qp", job.id, 3).await;
    assert_eq!(job.state, JobState::Failed);
    assert_waited(&job, &[150, 150]);
    let last = &job.attempts[2];
    assert_eq!(last.outcome, Some(AttemptOutcome::Failed));
    assert_eq!(last.retry_at, None);
    let reason = last.retry_reason.as_deref().unwrap();
    assert_eq!(
        RetryReason::of(reason),
        Some(RetryReason::AttemptsExhausted),
        "{reason}"
    );
    assert!(reason.contains("3 of 3"), "{reason}");

    // A job's own budget wins over the queue's.
    let own = enqueue(&c, json!({"queue": "qp", "payload": 2, "max_attempts": 1})).await;
    assert_eq!(own.max_attempts, 1);

    // A policy changed later leaves the jobs enqueued before it as they are.
    let (status, _) = c
        .api
        .patch("/v1/queues/qp", &json!({"max_attempts": null, "backoff": null}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(c.api.job(own.id).await.max_attempts, 1);
    let later = enqueue(&c, json!({"queue": "qp", "payload": 3})).await;
    assert_eq!(later.max_attempts, 4, "the coordinator's default again");
    assert_eq!(later.backoff, None);
}

#[tokio::test]
async fn each_backoff_field_falls_back_on_its_own_to_the_queue_then_the_defaults() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // The queue sets the factor and the cap; the job its jitter; the base
    // is the coordinator's default (1 s).
    let (status, body) = c
        .api
        .patch(
            "/v1/queues/mix",
            &json!({"backoff": {"factor": 1.5, "max_ms": 60000}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let job = enqueue(
        &c,
        json!({"queue": "mix", "payload": 1, "max_attempts": 3, "backoff": {"jitter": 0}}),
    )
    .await;
    let backoff = job.backoff.unwrap();
    assert_eq!(
        (backoff.factor, backoff.jitter, backoff.base_ms),
        (Some(1.5), Some(0.0), None)
    );
    let job = fail_times(&c, "mix", job.id, 2).await;
    let lease = claim_when_due(&c, "mix", job.id).await;
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    let job = c.api.job(job.id).await;
    assert_waited(&job, &[1000, 1500]);
    let reason = job.attempts[0].retry_reason.as_deref().unwrap();
    assert!(
        reason.contains("base 1000 ms, factor 1.5, max 60000 ms, jitter 0"),
        "{reason}"
    );
}

#[tokio::test]
async fn the_workers_retry_after_wins_over_the_backoff() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = enqueue(
        &c,
        json!({"queue": "ra", "payload": 1, "backoff": {"base_ms": 60000, "jitter": 0}}),
    )
    .await;
    let lease = c.api.claim_one("ra", "w").await;
    assert_eq!(c.api.fail(&lease, "busy", true, Some(120)).await.0, 200);
    let lease = claim_when_due(&c, "ra", job.id).await;
    assert_eq!(c.api.complete(&lease, json!("ok")).await.0, 200);
    let a = c.api.job(job.id).await.attempts;
    let planned = ms_between(a[0].finished_at.unwrap(), a[0].retry_at.unwrap());
    assert!((planned - 120).abs() <= TOLERANCE_MS, "{a:#?}");
    let reason = a[0].retry_reason.as_deref().unwrap();
    assert_eq!(RetryReason::of(reason), Some(RetryReason::RetryAfter), "{reason}");
}

#[tokio::test]
async fn the_retry_window_ends_retries_and_says_so() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // Retries every 400 ms, within 600 ms of the first start: the second
    // failure (about 400 ms in) would retry past the window.
    let job = enqueue(
        &c,
        json!({"queue": "win", "payload": 1, "max_attempts": 10, "retry_window_ms": 600,
               "backoff": {"base_ms": 400, "factor": 1, "jitter": 0}}),
    )
    .await;
    let job = fail_times(&c, "win", job.id, 2).await;
    assert_eq!(job.state, JobState::Failed, "{job:#?}");
    assert_eq!(job.attempt, 2, "budget was left");
    assert_waited(&job, &[400]);
    let last = &job.attempts[1];
    assert_eq!(last.retry_at, None);
    let reason = last.retry_reason.as_deref().unwrap();
    assert_eq!(
        RetryReason::of(reason),
        Some(RetryReason::RetryWindowEnded),
        "{reason}"
    );
    assert!(reason.contains("600 ms"), "{reason}");

    // An admin retry opens a fresh window: the next failure is retried.
    let (status, body) = c
        .api
        .post(&format!("/v1/jobs/{}/retry", job.id), &json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let job = fail_times(&c, "win", job.id, 1).await;
    assert_eq!(job.state, JobState::Queued, "{job:#?}");
    let reason = job.attempts.last().unwrap().retry_reason.as_deref().unwrap();
    assert_eq!(RetryReason::of(reason), Some(RetryReason::Backoff), "{reason}");
    // The failure that ended the job before the admin retry keeps its reason.
    let reason = job.attempts[1].retry_reason.as_deref().unwrap();
    assert_eq!(
        RetryReason::of(reason),
        Some(RetryReason::RetryWindowEnded),
        "{reason}"
    );
}

#[tokio::test]
async fn a_failure_marked_not_retryable_says_so() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("nr", json!(1)).await;
    let lease = c.api.claim_one("nr", "w").await;
    assert_eq!(c.api.fail(&lease, "bad input", false, None).await.0, 200);
    let job = c.api.job(job.id).await;
    assert_eq!(job.state, JobState::Failed);
    let reason = job.attempts[0].retry_reason.as_deref().unwrap();
    assert_eq!(
        RetryReason::of(reason),
        Some(RetryReason::NotRetryable),
        "{reason}"
    );
}

#[tokio::test]
async fn an_expired_lease_is_retried_at_once_within_the_window_and_not_after_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let open = enqueue(&c, json!({"queue": "rp", "payload": 1})).await;
    let closed = enqueue(&c, json!({"queue": "rp", "payload": 2, "retry_window_ms": 1})).await;
    let leases = c.api.claim("rp", "w", 2).await;
    assert_eq!(leases.len(), 2);
    expire_leases(&db, &[open.id.0, closed.id.0]).await;
    // The first attempt started more than 1 ms ago: past `closed`'s window.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let report = crate::reaping::reap_once(&db).await;
    assert_eq!((report.requeued, report.failed), (1, 1), "{report:?}");

    let a = &c.api.job(open.id).await.attempts[0];
    assert_eq!(a.outcome, Some(AttemptOutcome::LeaseExpired));
    assert_eq!(a.retry_at, a.finished_at, "claimable again at once: {a:?}");
    let reason = a.retry_reason.as_deref().unwrap();
    assert_eq!(
        RetryReason::of(reason),
        Some(RetryReason::LeaseExpired),
        "{reason}"
    );

    let job = c.api.job(closed.id).await;
    assert_eq!(job.state, JobState::Failed);
    let a = &job.attempts[0];
    assert_eq!(a.retry_at, None);
    let reason = a.retry_reason.as_deref().unwrap();
    assert_eq!(
        RetryReason::of(reason),
        Some(RetryReason::RetryWindowEnded),
        "{reason}"
    );
}

#[tokio::test]
async fn bad_retry_policies_are_refused_with_422() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let bad_jobs = [
        json!({"backoff": {"base_ms": -1}}),
        json!({"backoff": {"max_ms": 604800001}}),
        json!({"backoff": {"base_ms": 500, "max_ms": 100}}),
        json!({"backoff": {"factor": 0.5}}),
        json!({"backoff": {"factor": 11}}),
        json!({"backoff": {"jitter": 1.5}}),
        json!({"backoff": {"jitter": -0.1}}),
        json!({"backoff": {"base": 100}}),
        json!({"retry_window_ms": 0}),
        json!({"retry_window_ms": 31536000001i64}),
        json!({"max_attempts": 0}),
    ];
    for extra in &bad_jobs {
        let mut body = json!({"queue": "v", "payload": 1});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, answer) = c.api.post("/v1/jobs", &body).await;
        assert_eq!(status, 422, "{extra}: {answer}");
        assert!(
            answer["error"]["code"].is_string(),
            "the JSON error shape: {answer}"
        );
        let (status, answer) = c
            .api
            .post(
                "/v1/jobs/batch",
                &json!({"jobs": [{"queue": "v", "payload": 0}, body]}),
            )
            .await;
        assert_eq!(status, 422, "batch with {extra}: {answer}");
    }
    let bad_settings = [
        json!({"max_attempts": 1001}),
        json!({"backoff": {"base_ms": 10, "max_ms": 5}}),
        json!({"backoff": {"factor": 0}}),
        json!({"backoff": {"jitter": 2}}),
        json!({"retry_window_ms": -5}),
        json!({"dead_letter_queue": "v"}),
        json!({"dead_letter_queue": ""}),
        json!({"dead_letter_queue": "x".repeat(129)}),
    ];
    for body in &bad_settings {
        let (status, answer) = c.api.patch("/v1/queues/v", body).await;
        assert_eq!(status, 422, "{body}: {answer}");
        assert!(
            answer["error"]["code"].is_string(),
            "the JSON error shape: {answer}"
        );
    }
    // Nothing was written.
    assert_eq!(db.scalar("SELECT count(*) FROM jobs", &[]).await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM queue_settings", &[]).await, 0);
}

#[tokio::test]
async fn cli_queues_retry_sets_the_policy_and_queues_show_prints_it() {
    use runlease_tests::cli::{ok, refused, runlease};
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let url = c.api.base().to_owned();
    let out = ok(&runlease(
        &url,
        &[
            "queues",
            "retry",
            "emails",
            "--max-attempts",
            "7",
            "--backoff",
            "base_ms=250,factor=1.5,jitter=0",
            "--retry-window-ms",
            "60000",
            "--dead-letter-queue",
            "emails-dead",
        ],
        None,
    )
    .await);
    assert!(out.contains("max_attempts 7"), "{out}");
    let (_, shown) = c.api.get("/v1/queues/emails").await;
    assert_eq!(
        shown["settings"]["backoff"],
        json!({"base_ms": 250, "factor": 1.5, "jitter": 0.0})
    );
    assert_eq!(shown["settings"]["dead_letter_queue"], "emails-dead");

    let show = ok(&runlease(&url, &["queues", "show", "emails"], None).await);
    let row = |name: &str| -> String {
        show.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} row:\n{show}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(row("max_attempts"), "7");
    assert_eq!(row("backoff"), "base 250 ms, max default, factor 1.5, jitter 0");
    assert_eq!(row("retry_window"), "60000 ms");
    assert_eq!(row("dead_letter_queue"), "emails-dead");

    // `default` and `none` clear; bad values are refused before any call.
    ok(&runlease(
        &url,
        &[
            "queues",
            "retry",
            "emails",
            "--backoff",
            "default",
            "--dead-letter-queue",
            "none",
        ],
        None,
    )
    .await);
    let (_, shown) = c.api.get("/v1/queues/emails").await;
    assert!(shown["settings"]["backoff"].is_null(), "{shown}");
    assert!(shown["settings"]["dead_letter_queue"].is_null(), "{shown}");
    for bad in [
        vec!["--backoff", "factor=0.5"],
        vec!["--backoff", "speed=1"],
        vec!["--max-attempts", "0"],
        vec!["--dead-letter-queue", "emails"],
    ] {
        let mut args = vec!["queues", "retry", "emails"];
        args.extend(bad.iter().copied());
        let err = refused(&runlease(&url, &args, None).await);
        assert!(!err.is_empty(), "{bad:?}");
    }
    refused(&runlease(&url, &["queues", "retry", "emails"], None).await);
}
