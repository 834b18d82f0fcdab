//! The Lambda adapter's invocation handler (`LambdaWorker`), called as the
//! Lambda runtime calls it (a `LambdaEvent` with a context carrying the
//! invocation's deadline), against a real coordinator: SQS wake-ups and their
//! partial batch responses, scheduled sweeps, duplicate wake-ups, and
//! deadlines.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use runlease_client::protocol::producer::EnqueueJobRequest;
use runlease_client::protocol::{AttemptOutcome, JobId, JobState, QueueName};
use runlease_client::{Client, JobContext, JobError, WorkerBuilder};
use runlease_tests::lambda::{scheduled_event, sqs_event};
use runlease_tests::sqs::ReceivedMessage;
use runlease_tests::{TestCoordinator, TestDb};
use runlease_worker_lambda::lambda_runtime::{Config, Context, LambdaEvent};
use runlease_worker_lambda::{Answer, Error, LambdaWorker, example};
use serde_json::{Value, json};
use tokio::time::Instant;

/// Time left in invocations that run jobs of the default timeout (5 min):
/// only jobs whose timeout fits in the time left are handed out. A worker
/// that runs until idle returns as soon as its queues are empty anyway.
const ROOMY: Duration = Duration::from_secs(600);

const QUEUE_ARN: &str = "arn:aws:sqs:us-east-1:123456789012:runlease-wake";

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

/// A context as the Runtime API would give: a request id, the function's
/// name, and a deadline `time_left` from now.
fn context(time_left: Duration) -> Context {
    let mut ctx = Context::default();
    ctx.request_id = uuid::Uuid::new_v4().to_string();
    ctx.deadline = u64::try_from(
        (SystemTime::now() + time_left)
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    ctx.env_config = Arc::new(Config {
        function_name: "runlease-worker".into(),
        ..Default::default()
    });
    ctx
}

/// Wake-ups as SQS delivers them, one per queue name.
fn wake_ups(queues: &[&str]) -> Vec<ReceivedMessage> {
    queues
        .iter()
        .map(|queue| ReceivedMessage {
            message_id: uuid::Uuid::new_v4().to_string(),
            receipt_handle: uuid::Uuid::new_v4().simple().to_string(),
            body: json!({"queue": queue, "jobs": 1}).to_string(),
            md5_of_body: String::new(),
            attributes: json!({"ApproximateReceiveCount": "1"}),
        })
        .collect()
}

fn event(payload: Value, time_left: Duration) -> LambdaEvent<Value> {
    LambdaEvent::new(payload, context(time_left))
}

/// The JSON Lambda would get back.
fn wire(answer: &Answer) -> Value {
    serde_json::to_value(answer).unwrap()
}

/// Counts runs per job; completes each job with its payload.
fn counting_builder(url: &str, queue: &str, runs: Arc<Mutex<HashMap<JobId, u32>>>) -> WorkerBuilder {
    WorkerBuilder::new(Client::new(url).unwrap()).handle(q(queue), move |ctx: JobContext| {
        let runs = runs.clone();
        async move {
            *runs.lock().unwrap().entry(ctx.job_id()).or_default() += 1;
            // Long enough for concurrent invocations to overlap.
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok::<_, JobError>(ctx.raw_payload().clone())
        }
    })
}

fn unreachable_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn two_wake_ups_get_their_jobs_done_and_no_batch_item_failures() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let a = c.api.enqueue("lw-wake", json!({"n": 1})).await;
    let b = c.api.enqueue("lw-wake", json!({"n": 2})).await;
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let function = LambdaWorker::new(counting_builder(c.api.base(), "lw-wake", runs.clone()));

    let messages = wake_ups(&["lw-wake", "lw-wake"]);
    let ctx = context(ROOMY);
    let worker_id = format!("runlease-worker:{}", ctx.request_id);
    let invoked = function
        .invoke(LambdaEvent::new(sqs_event(QUEUE_ARN, &messages), ctx))
        .await
        .unwrap();
    assert_eq!(wire(&invoked.answer), json!({"batchItemFailures": []}));
    assert_eq!(invoked.report.completed, 2, "{:?}", invoked.report);
    for (job, n) in [(a, 1), (b, 2)] {
        let job = c.api.job(job.id).await;
        assert_eq!(job.state, JobState::Done);
        assert_eq!(job.result, Some(json!({"n": n})));
        assert_eq!(job.attempts.len(), 1);
        assert_eq!(
            job.attempts[0].worker_id.as_str(),
            worker_id,
            "the attempt names the invocation"
        );
    }
    assert!(runs.lock().unwrap().values().all(|n| *n == 1));
}

#[tokio::test]
async fn an_unreachable_coordinator_names_every_wake_up_in_batch_item_failures() {
    let url = unreachable_url();
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let function = LambdaWorker::new(counting_builder(&url, "lw-down", runs));

    let messages = wake_ups(&["lw-down", "lw-down", "elsewhere"]);
    let started = Instant::now();
    let invoked = function
        .invoke(event(sqs_event(QUEUE_ARN, &messages), Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "gives up after a few failed claims, long before the deadline"
    );
    assert_eq!(invoked.report.claims_answered, 0);
    assert!(invoked.report.claims_failed > 0);
    let failures: Vec<Value> = messages
        .iter()
        .map(|m| json!({"itemIdentifier": m.message_id}))
        .collect();
    assert_eq!(wire(&invoked.answer), json!({"batchItemFailures": failures}));

    // A sweep has no batch to answer: it fails, so the function's error
    // metrics show it.
    let swept = function
        .invoke(event(scheduled_event(), Duration::from_secs(30)))
        .await;
    assert!(matches!(swept, Err(Error::Unreachable { .. })), "{swept:?}");
}

#[tokio::test]
async fn an_invocation_without_time_to_claim_fails_its_wake_ups() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let job = c.api.enqueue("lw-late", json!(1)).await;
    let function = LambdaWorker::new(counting_builder(
        c.api.base(),
        "lw-late",
        Arc::new(Mutex::new(HashMap::new())),
    ));
    // Less time left than the release margin (2 s): nothing may be claimed.
    let messages = wake_ups(&["lw-late"]);
    let invoked = function
        .invoke(event(
            sqs_event(QUEUE_ARN, &messages),
            Duration::from_millis(1_500),
        ))
        .await
        .unwrap();
    assert_eq!(
        wire(&invoked.answer),
        json!({"batchItemFailures": [{"itemIdentifier": messages[0].message_id}]}),
        "SQS delivers it again, to an invocation with time"
    );
    assert_eq!(c.api.job(job.id).await.state, JobState::Queued);
}

#[tokio::test]
async fn a_scheduled_sweep_drains_the_backlog() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let jobs: Vec<Value> = (0..30)
        .map(|i| json!({"queue": "lw-sweep", "payload": i}))
        .collect();
    assert_eq!(c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await.0, 201);
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let function = LambdaWorker::new(counting_builder(c.api.base(), "lw-sweep", runs.clone()).concurrency(8));

    let answer = function.handle(event(scheduled_event(), ROOMY)).await.unwrap();
    assert_eq!(
        wire(&answer),
        json!({"invocation": "scheduled", "completed": 30, "failed": 0, "released": 0, "abandoned": 0})
    );
    let done: i64 = db
        .scalar("SELECT count(*) FROM jobs WHERE state = 'done'", &[])
        .await;
    assert_eq!(done, 30);
    assert_eq!(runs.lock().unwrap().len(), 30);

    // A direct invocation (any other JSON) sweeps too; nothing is left.
    let answer = function
        .handle(event(json!({"hello": "world"}), ROOMY))
        .await
        .unwrap();
    assert_eq!(
        wire(&answer),
        json!({"invocation": "direct", "completed": 0, "failed": 0, "released": 0, "abandoned": 0})
    );
}

#[tokio::test]
async fn a_wake_up_delivered_twice_runs_no_job_twice() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut ids = Vec::new();
    for i in 0..6 {
        ids.push(c.api.enqueue("lw-dup", json!(i)).await.id);
    }
    let runs = Arc::new(Mutex::new(HashMap::new()));
    let function = LambdaWorker::new(counting_builder(c.api.base(), "lw-dup", runs.clone()).concurrency(2));

    // SQS delivers at least once: the same message reaches two invocations
    // at once, and once more after they are done.
    let messages = wake_ups(&["lw-dup"]);
    let delivery = sqs_event(QUEUE_ARN, &messages);
    let (first, second) = tokio::join!(
        function.invoke(event(delivery.clone(), ROOMY)),
        function.invoke(event(delivery.clone(), ROOMY)),
    );
    let third = function.invoke(event(delivery, ROOMY)).await.unwrap();
    let (first, second) = (first.unwrap(), second.unwrap());
    for invoked in [&first, &second, &third] {
        assert_eq!(wire(&invoked.answer), json!({"batchItemFailures": []}));
    }
    assert_eq!(
        first.report.completed + second.report.completed + third.report.completed,
        6
    );
    assert!(
        first.report.completed > 0 && second.report.completed > 0,
        "both deliveries ran at once and claimed: {:?} {:?}",
        first.report,
        second.report
    );
    assert_eq!(third.report.completed, 0, "nothing was left for the repeat");

    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 6);
    assert!(runs.values().all(|n| *n == 1), "a job ran twice: {runs:?}");
    for id in ids {
        let job = c.api.job(id).await;
        assert_eq!(job.state, JobState::Done);
        assert_eq!(job.run_lease.0, 1, "claimed once");
        assert_eq!(crate::attempts_with(&db, id.0, "completed").await, 1);
    }
}

#[tokio::test]
async fn a_job_longer_than_the_time_left_is_released_and_resumed_by_the_next_invocation() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    // The example handler works 100 ms a step and checkpoints each step.
    // 2 s of work: more than an invocation with 3 s left can give before
    // its release point (deadline − 2 s margin); its attempt timeout
    // (2.8 s) fits in those 3 s, so it is handed out.
    let mut req = EnqueueJobRequest::new(q("lw-long"), json!({"work_ms": 2_000}));
    req.timeout_ms = Some(2_800);
    let job = c.api.enqueue_with(req).await;
    let builder = example::ExampleConfig {
        url: c.api.base().to_owned(),
        key: None,
        queue: q("lw-long"),
        concurrency: 1,
    }
    .builder()
    .unwrap();
    let function = LambdaWorker::new(builder);

    let ctx = context(Duration::from_secs(3));
    let deadline = Instant::now() + Duration::from_secs(3);
    let first = function
        .invoke(LambdaEvent::new(
            sqs_event(QUEUE_ARN, &wake_ups(&["lw-long"])),
            ctx,
        ))
        .await
        .unwrap();
    assert!(
        Instant::now() < deadline,
        "the invocation ended before its deadline"
    );
    assert_eq!(wire(&first.answer), json!({"batchItemFailures": []}));
    assert_eq!(
        (first.report.completed, first.report.released),
        (0, 1),
        "{:?}",
        first.report
    );

    let released = c.api.job(job.id).await;
    assert_eq!(released.state, JobState::Queued);
    assert_eq!(released.attempt, 0, "the release charged no attempt");
    assert_eq!(released.attempts.len(), 1);
    assert_eq!(released.attempts[0].outcome, Some(AttemptOutcome::Released));
    let checkpoint = released
        .progress
        .clone()
        .expect("the release kept the checkpoint")["done_ms"]
        .as_u64()
        .unwrap();
    assert!((100..2_000).contains(&checkpoint), "checkpoint {checkpoint} ms");

    // The next invocation, with more time, resumes at the checkpoint.
    let second = function
        .invoke(event(scheduled_event(), Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(second.report.completed, 1, "{:?}", second.report);
    let done = c.api.job(job.id).await;
    assert_eq!(done.state, JobState::Done);
    let result = done.result.unwrap();
    assert_eq!(result["resumed_from_ms"], json!(checkpoint));
    assert_eq!(result["attempt"], json!(1), "still the first charged attempt");
    let outcomes: Vec<_> = done.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        vec![Some(AttemptOutcome::Released), Some(AttemptOutcome::Completed)]
    );
}
