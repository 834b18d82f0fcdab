//! The whole wake-up path with the example function (`bootstrap`) under the
//! real Lambda Runtime API contract: a job enqueued on an SQS-bound queue, the
//! coordinator's wake-up in SQS (moto), the message received and delivered as
//! Lambda's SQS event source mapping delivers it, to the function running
//! under cargo-lambda's emulator, which claims over HTTP from the
//! coordinator. These tests run cargo (the emulator builds the function), so
//! they share a nextest group of one thread (`.config/nextest.toml`).

use std::net::SocketAddr;

use runlease_client::protocol::{AttemptOutcome, JobState};
use runlease_tests::lambda::{FUNCTION, LambdaEmulator, scheduled_event, sqs_event};
use runlease_tests::sqs::ReceivedMessage;
use runlease_tests::{CoordinatorProcess, Proxy, TestDb, TestSqs};
use serde_json::{Value, json};

/// The coordinator's next wake-up in the queue.
async fn next_wake_up(sqs: &TestSqs, url: &str) -> ReceivedMessage {
    for _ in 0..20 {
        let mut received = sqs.receive_messages(url, 1).await;
        if let Some(message) = received.pop() {
            assert!(received.is_empty(), "one wake-up at a time here");
            return message;
        }
    }
    panic!("no wake-up arrived in 20 s");
}

#[tokio::test]
async fn a_job_enqueued_on_an_sqs_bound_queue_is_run_by_the_function_the_wake_up_starts() {
    let db = TestDb::new().await;
    let sqs = TestSqs::start().await;
    let queue_url = sqs.create_queue("runlease-wake").await;
    let queue_arn = sqs.queue_arn(&queue_url).await;
    let mut env = sqs.env();
    env.push((
        "RUNLEASE_SQS_QUEUES",
        format!("le-emails={queue_url},le-other={queue_url}"),
    ));
    env.push(("RUNLEASE_SQS_DISPATCH_INTERVAL_MS", "200".into()));
    let c = CoordinatorProcess::start(&db, &env).await;
    // The function reaches the coordinator through a proxy the test can cut.
    let addr: SocketAddr = c.api.base().trim_start_matches("http://").parse().unwrap();
    let proxy = Proxy::start(addr).await;
    // The example serves only the queue named for it, never those of
    // RUNLEASE_QUEUES (which the stack sets for a function's own code).
    let function = LambdaEmulator::start(&[
        ("RUNLEASE_URL", proxy.url()),
        ("RUNLEASE_QUEUES", "le-emails,le-other".to_owned()),
        ("RUNLEASE_EXAMPLE_QUEUE", "le-emails".to_owned()),
    ])
    .await;

    // Enqueued: the coordinator commits the job, then sends its wake-up.
    let job = c.api.enqueue("le-emails", json!({"to": "ada@example.com"})).await;
    let wake_up = next_wake_up(&sqs, &queue_url).await;
    assert_eq!(
        serde_json::from_str::<Value>(&wake_up.body).unwrap(),
        json!({"queue": "le-emails", "jobs": 1})
    );
    let (status, answer) = function
        .invoke(&sqs_event(&queue_arn, std::slice::from_ref(&wake_up)))
        .await;
    assert_eq!(status, 200, "{answer}\n{}", function.log());
    assert_eq!(answer, json!({"batchItemFailures": []}));
    // Nothing named: the event source mapping deletes the message.
    sqs.delete(&queue_url, &wake_up.receipt_handle).await;

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

    // The coordinator unreachable from the function: the wake-up is named in
    // batchItemFailures, so it stays in SQS; its job waits in PostgreSQL.
    let waiting = c.api.enqueue("le-emails", json!(2)).await;
    let wake_up = next_wake_up(&sqs, &queue_url).await;
    proxy.cut();
    let (status, answer) = function
        .invoke(&sqs_event(&queue_arn, std::slice::from_ref(&wake_up)))
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"batchItemFailures": [{"itemIdentifier": wake_up.message_id}]})
    );
    assert_eq!(c.api.job(waiting.id).await.state, JobState::Queued);

    // Back: SQS delivers the named wake-up again (its visibility timeout
    // over), and this time the job runs.
    proxy.heal();
    sqs.make_visible(&queue_url, &wake_up.receipt_handle).await;
    let again = next_wake_up(&sqs, &queue_url).await;
    assert_eq!(again.message_id, wake_up.message_id);
    assert_eq!(again.attributes["ApproximateReceiveCount"], json!("2"));
    let (status, answer) = function
        .invoke(&sqs_event(&queue_arn, std::slice::from_ref(&again)))
        .await;
    assert_eq!((status, answer), (200, json!({"batchItemFailures": []})));
    sqs.delete(&queue_url, &again.receipt_handle).await;
    assert_eq!(c.api.job(waiting.id).await.state, JobState::Done);

    // A wake-up that never reaches the function: the scheduled sweep runs
    // its job anyway.
    let orphan = c.api.enqueue("le-emails", json!(3)).await;
    let lost = next_wake_up(&sqs, &queue_url).await;
    sqs.delete(&queue_url, &lost.receipt_handle).await;
    let (status, answer) = function.invoke(&scheduled_event()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        answer,
        json!({"invocation": "scheduled", "completed": 1, "failed": 0, "released": 0, "abandoned": 0})
    );
    assert_eq!(c.api.job(orphan.id).await.state, JobState::Done);

    // A job of a queue that is not the example's is never taken, by a
    // wake-up or by a sweep.
    let other = c.api.enqueue("le-other", json!(4)).await;
    let wake_up = next_wake_up(&sqs, &queue_url).await;
    let (status, answer) = function
        .invoke(&sqs_event(&queue_arn, std::slice::from_ref(&wake_up)))
        .await;
    assert_eq!((status, answer), (200, json!({"batchItemFailures": []})));
    sqs.delete(&queue_url, &wake_up.receipt_handle).await;
    let (status, answer) = function.invoke(&scheduled_event()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["completed"], json!(0), "{answer}");
    let other = c.api.job(other.id).await;
    assert_eq!(other.state, JobState::Queued);
    assert!(other.attempts.is_empty(), "never claimed");
    // Every wake-up consumed: none is owed (every claimable job's due time
    // is signalled, so no pass sends another), the coordinator sent exactly
    // the four the test received, and none is left in SQS.
    let owed = db
        .scalar(
            "SELECT count(*) FROM jobs WHERE state IN ('queued', 'enqueue_failed')
               AND dispatched_run_at IS DISTINCT FROM run_at",
            &[],
        )
        .await;
    assert_eq!(owed, 0, "no wake-up still to send");
    let sent = c
        .api
        .metric("runlease_sqs_wakeups_sent_total{queue=\"le-emails\"}")
        .await
        + c.api
            .metric("runlease_sqs_wakeups_sent_total{queue=\"le-other\"}")
            .await;
    assert_eq!(sent, 4.0, "one wake-up per enqueue, none sent again");
    assert_eq!(sqs.counts(&queue_url).await, (0, 0), "every wake-up consumed");
}
