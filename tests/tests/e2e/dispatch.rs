//! SQS wake-ups for Lambda workers (moto's SQS server): sent when jobs become
//! due, scaled to the backlog, and re-sent when SQS was unreachable.

use std::time::Duration;

use runlease_tests::{CoordinatorProcess, TestDb, TestSqs};
use serde_json::{Value, json};

fn bodies_total(bodies: &[String]) -> i64 {
    bodies
        .iter()
        .map(|b| {
            serde_json::from_str::<Value>(b).unwrap()["jobs"]
                .as_i64()
                .unwrap()
        })
        .sum()
}

async fn receive_all(sqs: &TestSqs, url: &str, want_jobs: i64) -> Vec<String> {
    let mut bodies = Vec::new();
    for _ in 0..20 {
        bodies.extend(sqs.receive(url, 1).await);
        if bodies_total(&bodies) >= want_jobs {
            break;
        }
    }
    bodies
}

fn coordinator_env(sqs: &TestSqs, bindings: &str) -> Vec<(&'static str, String)> {
    let mut env = sqs.env();
    env.push(("RUNLEASE_SQS_QUEUES", bindings.to_owned()));
    env.push(("RUNLEASE_SQS_DISPATCH_INTERVAL_MS", "200".into()));
    env.push(("RUNLEASE_REDIS_URL", String::new()));
    env
}

#[tokio::test]
async fn enqueues_on_an_sqs_bound_queue_send_wakeups_scaled_to_the_backlog() {
    let db = TestDb::new().await;
    let sqs = TestSqs::start().await;
    let url = sqs.create_queue("lambda-wakeups").await;
    let c = CoordinatorProcess::start(&db, &coordinator_env(&sqs, &format!("lambda={url}"))).await;

    // A trickle: one message per job.
    c.api.enqueue("lambda", json!(1)).await;
    let bodies = receive_all(&sqs, &url, 1).await;
    assert_eq!(bodies.len(), 1, "{bodies:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&bodies[0]).unwrap(),
        json!({"queue": "lambda", "jobs": 1})
    );

    // A burst: one message per 10 jobs.
    let jobs: Vec<Value> = (0..250)
        .map(|i| json!({"queue": "lambda", "payload": i}))
        .collect();
    assert_eq!(c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await.0, 201);
    let bodies = receive_all(&sqs, &url, 250).await;
    assert_eq!(bodies_total(&bodies), 250);
    assert_eq!(bodies.len(), 25, "10 jobs per wake-up");

    // Queues not bound to SQS send nothing.
    c.api.enqueue("elsewhere", json!(1)).await;
    assert!(sqs.receive(&url, 1).await.is_empty());
    let (_, metrics) = c.api.get_text("/metrics").await;
    assert!(
        metrics.contains("runlease_sqs_wakeups_sent_total{queue=\"lambda\"} 26"),
        "{metrics}"
    );
}

#[tokio::test]
async fn jobs_that_become_due_later_are_woken_when_due() {
    let db = TestDb::new().await;
    let sqs = TestSqs::start().await;
    let url = sqs.create_queue("later").await;
    let c = CoordinatorProcess::start(&db, &coordinator_env(&sqs, &format!("lambda={url}"))).await;

    let (status, _) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "lambda", "payload": 1, "delay_ms": 1500}),
        )
        .await;
    assert_eq!(status, 201);
    assert!(sqs.receive(&url, 1).await.is_empty(), "not due yet: no wake-up");
    let bodies = receive_all(&sqs, &url, 1).await;
    assert_eq!(bodies_total(&bodies), 1, "woken once due");

    // A failed attempt is retried later: it is woken again when due again.
    let lease = c.api.claim_one("lambda", "lambda-worker").await;
    assert_eq!(c.api.fail(&lease, "flaky", true, Some(500)).await.0, 200);
    let bodies = receive_all(&sqs, &url, 1).await;
    assert_eq!(bodies_total(&bodies), 1, "the retry is woken when it is due");
}

#[tokio::test]
async fn wakeups_that_could_not_be_sent_are_sent_once_sqs_is_back() {
    let db = TestDb::new().await;
    // SQS is unreachable when the job is enqueued.
    let mut sqs = TestSqs::not_started();
    let url = format!("{}/123456789012/outage", sqs.endpoint());
    let c = CoordinatorProcess::start(&db, &coordinator_env(&sqs, &format!("lambda={url}"))).await;
    let job = c.api.enqueue("lambda", json!("during the outage")).await;
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = c.api.get_text("/metrics").await.1;
        if metrics.contains("runlease_sqs_send_failures_total{queue=\"lambda\"}") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        metrics.contains("runlease_sqs_send_failures_total{queue=\"lambda\"}"),
        "{metrics}"
    );
    // The job stays claimable all along.
    assert_eq!(c.api.job(job.id).await.state, runlease_protocol::JobState::Queued);

    sqs.resume().await;
    let created = sqs.create_queue("outage").await;
    assert_eq!(
        created, url,
        "moto's queue URL is the one the coordinator was given"
    );
    let bodies = receive_all(&sqs, &url, 1).await;
    assert_eq!(bodies_total(&bodies), 1, "re-sent once SQS was back");
    let (_, metrics) = c.api.get_text("/metrics").await;
    assert!(
        metrics.contains("runlease_sqs_send_retries_total{queue=\"lambda\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_job_due_later_is_woken_while_other_queues_are_busy() {
    let db = TestDb::new().await;
    let sqs = TestSqs::start().await;
    let url = sqs.create_queue("busy-neighbours").await;
    let c = CoordinatorProcess::start(&db, &coordinator_env(&sqs, &format!("lambda={url}"))).await;

    // Enqueues to another queue, far more often than the dispatch interval
    // (200 ms): each is a wake-up the dispatcher sees and skips.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let api = c.api.clone();
    let flag = stop.clone();
    let neighbour = tokio::spawn(async move {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            api.enqueue("elsewhere", json!(1)).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let (status, _) = c
        .api
        .post(
            "/v1/jobs",
            &json!({"queue": "lambda", "payload": 1, "delay_ms": 1000}),
        )
        .await;
    assert_eq!(status, 201);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut bodies = Vec::new();
    while bodies.is_empty() && std::time::Instant::now() < deadline {
        bodies.extend(sqs.receive(&url, 1).await);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    neighbour.await.unwrap();
    assert_eq!(
        bodies_total(&bodies),
        1,
        "the due job is woken despite the busy neighbour queue"
    );
}
