//! The example function (`bootstrap`) through the real Lambda Runtime API
//! contract, under cargo-lambda's emulator: a wake-up message goes through
//! SQS (moto), is received back and delivered as Lambda's SQS event source
//! mapping would deliver it, and the function claims over HTTP from the
//! coordinator. These tests run cargo (the emulator builds the function), so
//! they share a nextest group of one thread (`.config/nextest.toml`).

use runlease_client::protocol::{AttemptOutcome, JobState};
use runlease_tests::lambda::{FUNCTION, LambdaEmulator};
use runlease_tests::sqs::{TestSqs, scheduled_event, sqs_event};
use runlease_tests::{Proxy, TestCoordinator, TestDb};
use serde_json::json;

#[tokio::test]
async fn a_wake_up_from_sqs_runs_the_job_through_the_lambda_runtime_api() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // The function reaches the coordinator through a proxy the test can cut.
    let proxy = Proxy::start(c.addr).await;
    let sqs = TestSqs::start().await;
    let queue_url = sqs.create_queue("runlease-wake").await;
    let queue_arn = sqs.queue_arn(&queue_url).await;
    let function = LambdaEmulator::start(&[
        ("RUNLEASE_URL", proxy.url()),
        ("RUNLEASE_QUEUES", "le-emails,le-other".to_owned()),
    ])
    .await;

    // Enqueued, then woken up as the coordinator does: the job is committed
    // before its wake-up is sent.
    let job = c.api.enqueue("le-emails", json!({"to": "ada@example.com"})).await;
    let sent_id = sqs
        .send(&queue_url, &json!({"queue": "le-emails", "jobs": 1}).to_string())
        .await;
    let received = sqs.receive(&queue_url, 10, 1).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].message_id, sent_id);

    let (status, answer) = function.invoke(&sqs_event(&queue_arn, &received)).await;
    assert_eq!(status, 200, "{answer}\n{}", function.log());
    assert_eq!(answer, json!({"batchItemFailures": []}));
    // Nothing named: the event source mapping deletes the message.
    sqs.delete(&queue_url, &received[0].receipt_handle).await;
    assert_eq!(sqs.counts(&queue_url).await, (0, 0));

    let done = c.api.job(job.id).await;
    assert_eq!(done.state, JobState::Done, "{}", function.log());
    let result = done.result.unwrap();
    assert_eq!(result["queue"], json!("le-emails"));
    assert_eq!(result["payload"], json!({"to": "ada@example.com"}));
    assert_eq!(done.attempts.len(), 1);
    assert_eq!(done.attempts[0].outcome, Some(AttemptOutcome::Completed));
    assert!(
        done.attempts[0]
            .worker_id
            .as_str()
            .starts_with(&format!("{FUNCTION}:")),
        "the attempt names the invocation: {}",
        done.attempts[0].worker_id
    );

    // The coordinator unreachable: the wake-up is named in batchItemFailures,
    // so SQS delivers it again; its job waits, claimable, in PostgreSQL.
    let waiting = c.api.enqueue("le-other", json!(2)).await;
    sqs.send(&queue_url, &json!({"queue": "le-other", "jobs": 1}).to_string())
        .await;
    let received = sqs.receive(&queue_url, 10, 1).await;
    assert_eq!(received.len(), 1);
    proxy.cut();
    let (status, answer) = function.invoke(&sqs_event(&queue_arn, &received)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"batchItemFailures": [{"itemIdentifier": received[0].message_id}]})
    );
    assert_eq!(c.api.job(waiting.id).await.state, JobState::Queued);

    // The scheduled sweep, once the coordinator is back, finishes it.
    proxy.heal();
    let (status, answer) = function.invoke(&scheduled_event()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"invocation": "scheduled", "completed": 1, "failed": 0, "released": 0, "abandoned": 0})
    );
    assert_eq!(c.api.job(waiting.id).await.state, JobState::Done);
}
