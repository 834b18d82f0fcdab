//! The worker runtime against a real coordinator: crashes, lost leases,
//! partitions, drain, deadline mode, scale, and lost answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use runlease_client::protocol::{AttemptOutcome, JobState, QueueName, WorkerId};
use runlease_client::{Client, JobContext, JobError, Worker};
use runlease_tests::{Proxy, TestCoordinator, TestDb};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

fn q(name: &str) -> QueueName {
    QueueName::new(name).unwrap()
}

fn client(url: &str) -> Client {
    Client::new(url).unwrap()
}

/// Fast leases so expiry-driven tests take a second, not a minute.
fn fast(cfg: &mut runlease_coordinator::config::Config) {
    cfg.leases.ttl = std::time::Duration::from_millis(1_000);
    cfg.leases.heartbeat_interval = std::time::Duration::from_millis(250);
    cfg.leases.reaper_interval = std::time::Duration::from_millis(100);
}

async fn wait_for_state(c: &TestCoordinator, id: runlease_client::protocol::JobId, state: JobState) {
    for _ in 0..400 {
        if c.api.job(id).await.state == state {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} never reached {state}");
}

#[tokio::test]
async fn a_worker_aborted_mid_job_is_reaped_and_another_completes_it() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, fast).await;
    let job = c.api.enqueue("crash", json!({"n": 1})).await;

    // Worker A runs on a runtime of its own; shutting that runtime down kills
    // every task of the worker at once, as a crash would.
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let worker_a = Worker::builder(client(c.api.base()))
        .worker_id(WorkerId::new("worker-a").unwrap())
        .claim_wait(Duration::from_millis(500))
        .handle(q("crash"), move |_ctx: JobContext| {
            let started_tx = started_tx.clone();
            async move {
                let _ = started_tx.send(());
                std::future::pending::<()>().await;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .unwrap();
    rt.spawn(worker_a.run(CancellationToken::new()));
    started_rx.recv().await.unwrap();
    rt.shutdown_background();

    let done = Arc::new(AtomicUsize::new(0));
    let d = done.clone();
    let worker_b = Worker::builder(client(c.api.base()))
        .worker_id(WorkerId::new("worker-b").unwrap())
        .claim_wait(Duration::from_millis(500))
        .handle(q("crash"), move |ctx: JobContext| {
            let d = d.clone();
            async move {
                d.fetch_add(1, Ordering::SeqCst);
                Ok::<_, JobError>(json!({"attempt": ctx.attempt()}))
            }
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let b = tokio::spawn(worker_b.run(stop.clone()));
    wait_for_state(&c, job.id, JobState::Done).await;
    stop.cancel();
    let report = b.await.unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(done.load(Ordering::SeqCst), 1);

    let finished = c.api.job(job.id).await;
    assert_eq!(finished.result, Some(json!({"attempt": 2})));
    let chronology: Vec<_> = finished
        .attempts
        .iter()
        .map(|a| (a.worker_id.as_str().to_owned(), a.outcome))
        .collect();
    assert_eq!(
        chronology,
        vec![
            ("worker-a".to_owned(), Some(AttemptOutcome::LeaseExpired)),
            ("worker-b".to_owned(), Some(AttemptOutcome::Completed)),
        ]
    );
}

#[tokio::test]
async fn a_lost_lease_cancels_the_handler_and_its_late_result_never_lands() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        // Heartbeats far apart, so none renews the lease between the test
        // expiring it and reaping it; the next one learns it was lost.
        cfg.leases.ttl = std::time::Duration::from_millis(6_000);
        cfg.leases.heartbeat_interval = std::time::Duration::from_millis(2_000);
    })
    .await;
    let job = c.api.enqueue("lost", json!(1)).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<&'static str>();
    let worker = Worker::builder(client(c.api.base()))
        // One slot, busy with the job: the worker does not claim it back.
        .concurrency(1)
        .claim_wait(Duration::from_millis(300))
        .handle(q("lost"), move |ctx: JobContext| {
            let tx = tx.clone();
            async move {
                let _ = tx.send("started");
                ctx.cancelled().await;
                let _ = tx.send("cancelled");
                // A handler that ignores the cancel and answers anyway.
                Ok::<_, JobError>(json!("late result"))
            }
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    assert_eq!(rx.recv().await, Some("started"));

    // The lease is taken away while the handler sleeps: expired and reaped,
    // then claimed and completed by someone else.
    // The worker heartbeats every 200 ms: one may renew the lease between the
    // expiry and the reap, so expire it again until the reaper takes it.
    loop {
        crate::expire_leases(&db, &[job.id.0]).await;
        if crate::reaping::reap_once(&db).await.requeued == 1 {
            break;
        }
    }
    let other = c.api.claim_one("lost", "other").await;
    assert_eq!(c.api.complete(&other, json!("winning result")).await.0, 200);

    let cancelled = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap();
    assert_eq!(cancelled, Some("cancelled"), "the handler's cancellation fired");
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(
        (report.completed, report.failed, report.released, report.abandoned),
        (0, 0, 0, 1),
        "{report:?}"
    );
    let finished = c.api.job(job.id).await;
    assert_eq!(finished.result, Some(json!("winning result")));
    assert_eq!(crate::attempts_with(&db, job.id.0, "completed").await, 1);
}

#[tokio::test]
async fn a_partitioned_worker_fences_itself_and_nothing_of_its_attempt_lands() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, fast).await;
    let proxy = Proxy::start(c.addr).await;
    let job = c.api.enqueue("part", json!(1)).await;

    let (tx, mut rx) = mpsc::unbounded_channel::<(&'static str, Instant)>();
    let partitioned = Worker::builder(client(&proxy.url()))
        .worker_id(WorkerId::new("partitioned").unwrap())
        .claim_wait(Duration::from_millis(300))
        .stop_grace(Duration::from_millis(200))
        .handle(q("part"), move |ctx: JobContext| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(("started", Instant::now()));
                ctx.report_progress(json!({"step": 1}));
                ctx.cancelled().await;
                let _ = tx.send(("fenced", Instant::now()));
                Ok::<_, JobError>(json!("fenced result"))
            }
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(partitioned.run(stop.clone()));
    assert_eq!(rx.recv().await.unwrap().0, "started");
    proxy.cut();

    let (what, fenced_at) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        what, "fenced",
        "the worker stopped its handler after a TTL without heartbeats"
    );
    // The reaper takes the job back; a healthy worker runs it.
    let mut lease = None;
    for _ in 0..100 {
        if let Some(l) = c.api.claim_wait("part", "healthy", 1, 200).await.pop() {
            lease = Some(l);
            break;
        }
    }
    let lease = lease.expect("the reaper re-queued the job");
    let claimed_at = Instant::now();
    assert!(
        fenced_at <= claimed_at,
        "the fenced worker stopped before anyone else started"
    );
    assert_eq!(c.api.complete(&lease, json!("healthy result")).await.0, 200);

    proxy.heal();
    // The partition is over once the fenced worker reaches the coordinator
    // again: its next claim parks there (nobody else is claiming). Whatever
    // it still had to say about its attempt could now land, and must not.
    c.api.until_claims_parked(1).await;
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.completed, 0);
    assert_eq!(report.abandoned, 1);
    let finished = c.api.job(job.id).await;
    assert_eq!(finished.state, JobState::Done);
    assert_eq!(finished.result, Some(json!("healthy result")));
    let outcomes: Vec<_> = finished.attempts.iter().map(|a| a.outcome).collect();
    assert_eq!(
        outcomes,
        vec![
            Some(AttemptOutcome::LeaseExpired),
            Some(AttemptOutcome::Completed)
        ]
    );
}

async fn finish_elsewhere(c: &TestCoordinator, queue: &str) -> runlease_client::protocol::worker::Lease {
    let lease = c
        .api
        .claim_wait(queue, "next", 1, 5_000)
        .await
        .pop()
        .expect("released job is claimable at once");
    assert_eq!(c.api.complete(&lease, json!("finished elsewhere")).await.0, 200);
    lease
}

#[tokio::test]
async fn drain_releases_what_it_cannot_finish() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await; // 15 s TTL: a release must not wait for it
    let job = c.api.enqueue("drain", json!(1)).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let worker = Worker::builder(client(c.api.base()))
        .claim_wait(Duration::from_millis(300))
        .drain_timeout(Duration::from_millis(300))
        .stop_grace(Duration::from_millis(300))
        .handle(q("drain"), move |ctx: JobContext| {
            let tx = tx.clone();
            async move {
                ctx.report_progress(json!({"page": 3}));
                let _ = tx.send(());
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok::<_, JobError>(())
            }
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    rx.recv().await.unwrap();
    let started = Instant::now();
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.released, 1);
    let next = finish_elsewhere(&c, "drain").await;
    assert!(started.elapsed() < Duration::from_secs(10), "no TTL wait");
    assert_eq!(next.attempt, 1, "the release charged no attempt");
    assert_eq!(
        next.progress,
        Some(json!({"page": 3})),
        "the checkpoint travels with the release"
    );
    let finished = c.api.job(job.id).await;
    assert_eq!(finished.attempts[0].outcome, Some(AttemptOutcome::Released));
}

#[tokio::test]
async fn deadline_mode_releases_before_the_deadline_and_skips_jobs_that_do_not_fit() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let mut too_long =
        runlease_client::protocol::producer::EnqueueJobRequest::new(q("deadline"), json!("long"));
    too_long.timeout_ms = Some(60_000);
    too_long.priority = Some(5);
    let too_long = c.api.enqueue_with(too_long).await;
    let mut fits = runlease_client::protocol::producer::EnqueueJobRequest::new(q("deadline"), json!("fits"));
    fits.timeout_ms = Some(2_500);
    fits.priority = Some(1);
    let fits = c.api.enqueue_with(fits).await;

    let seen = Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let s = seen.clone();
    let deadline = Instant::now() + Duration::from_secs(3);
    let worker = Worker::builder(client(c.api.base()))
        .deadline(deadline, Duration::from_secs(1))
        .claim_wait(Duration::from_millis(200))
        .handle(q("deadline"), move |ctx: JobContext| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(ctx.raw_payload().clone());
                // Needs 10 s; stops when told, without having finished.
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(10)) => Ok::<_, JobError>(()),
                    () = ctx.cancelled() => Err(JobError::retryable("interrupted")),
                }
            }
        })
        .build()
        .unwrap();
    let report = worker.run(CancellationToken::new()).await;
    assert!(
        Instant::now() < deadline,
        "the worker returned before its deadline"
    );
    assert_eq!(report.released, 1);
    assert_eq!(
        *seen.lock().unwrap(),
        vec![json!("fits")],
        "the 60 s job never fit in 3 s"
    );

    let next = finish_elsewhere(&c, "deadline").await;
    assert_eq!(next.job_id, fits.id);
    assert_eq!(next.attempt, 1, "no attempt charged for the release");
    assert_eq!(c.api.job(too_long.id).await.state, JobState::Queued);
}

#[tokio::test]
async fn twenty_workers_finish_five_thousand_jobs_each_exactly_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| cfg.database.pool_size = 16).await;
    for chunk in 0..5 {
        let jobs: Vec<Value> = (0..1000)
            .map(|i| json!({"queue": "scale", "payload": chunk * 1000 + i}))
            .collect();
        assert_eq!(c.api.post("/v1/jobs/batch", &json!({"jobs": jobs})).await.0, 201);
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let stop = CancellationToken::new();
    let mut workers = Vec::new();
    for w in 0..20 {
        let runs = runs.clone();
        let worker = Worker::builder(client(c.api.base()))
            .worker_id(WorkerId::new(format!("scale-{w}")).unwrap())
            .concurrency(4)
            .claim_wait(Duration::from_millis(500))
            .handle(q("scale"), move |ctx: JobContext| {
                let runs = runs.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let n: i64 = ctx.payload()?;
                    Ok::<_, JobError>(n * 2)
                }
            })
            .build()
            .unwrap();
        workers.push(tokio::spawn(worker.run(stop.clone())));
    }
    let client_db = db.client().await;
    for _ in 0..1200 {
        let done: i64 = client_db
            .query_one("SELECT count(*) FROM jobs WHERE state = 'done'", &[])
            .await
            .unwrap()
            .get(0);
        if done == 5000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.cancel();
    let mut completed = 0;
    for w in workers {
        completed += w.await.unwrap().completed;
    }
    assert_eq!(completed, 5000);
    assert_eq!(runs.load(Ordering::SeqCst), 5000, "no job ran twice");
    let row = client_db
        .query_one(
            "SELECT count(*) FILTER (WHERE state = 'done'), count(*),
                    count(*) FILTER (WHERE result = to_jsonb((payload::text)::bigint * 2))
             FROM jobs",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1), row.get::<_, i64>(2)),
        (5000, 5000, 5000)
    );
    let attempts: i64 = client_db
        .query_one(
            "SELECT count(*) FROM job_attempts WHERE outcome = 'completed'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 5000);
}

#[tokio::test]
async fn a_lost_complete_answer_is_retried_and_the_job_is_not_run_again() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    let proxy = Proxy::start(c.addr).await;
    let job = c.api.enqueue("lossy", json!(7)).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let r = runs.clone();
    // The runtime finishes through POST /v1/finish.
    proxy.swallow_next_answer_to("POST /v1/finish");
    let worker = Worker::builder(client(&proxy.url()))
        .claim_wait(Duration::from_millis(300))
        .handle(q("lossy"), move |_ctx: JobContext| {
            let r = r.clone();
            async move {
                r.fetch_add(1, Ordering::SeqCst);
                Ok::<_, JobError>(json!("only once"))
            }
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    wait_for_state(&c, job.id, JobState::Done).await;
    // The coordinator has answered the finish twice: the answer the proxy
    // swallowed, and the retry's, which reaches the worker (its drain waits
    // for the job's finish to end).
    c.api
        .until_metric(
            "runlease_request_duration_seconds_count{route=\"/v1/finish\",method=\"POST\",status=\"2xx\"}",
            "the retried finish was answered",
            |v| v >= 2.0,
        )
        .await;
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(proxy.swallowed(), 1, "one answer was lost on the way");
    assert_eq!(report.completed, 1, "the retried complete was answered 200");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let finished = c.api.job(job.id).await;
    assert_eq!(finished.run_lease.0, 1, "never claimed again");
    assert_eq!(finished.result, Some(json!("only once")));
    assert_eq!(crate::attempts_with(&db, job.id.0, "completed").await, 1);
}

#[tokio::test]
async fn a_lease_from_a_long_parked_claim_is_not_fenced_at_once() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start_with(&db, |cfg| {
        cfg.leases.ttl = std::time::Duration::from_millis(1_000);
        cfg.leases.heartbeat_interval = std::time::Duration::from_millis(300);
    })
    .await;
    let worker = Worker::builder(client(c.api.base()))
        .concurrency(1)
        // Parks far longer than the lease TTL before the job arrives.
        .claim_wait(Duration::from_secs(5))
        .handle(q("late"), |ctx: JobContext| async move {
            tokio::time::sleep(Duration::from_millis(1_500)).await;
            if ctx.is_cancelled() {
                return Err(JobError::retryable("stopped"));
            }
            Ok::<_, JobError>(json!("ran to the end"))
        })
        .build()
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone()));
    c.api.until_claims_parked(1).await;
    // The scenario itself: the claim stays parked 2.5 TTLs.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        c.api
            .metric(
                "runlease_request_duration_seconds_count{route=\"/v1/claim\",method=\"POST\",status=\"2xx\"}"
            )
            .await,
        0.0,
        "no claim answered yet: the one parked since before is the one the job goes to"
    );
    let job = c.api.enqueue("late", json!(1)).await;
    wait_for_state(&c, job.id, JobState::Done).await;
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
    assert_eq!(c.api.job(job.id).await.result, Some(json!("ran to the end")));
}

#[tokio::test]
async fn until_idle_drains_the_queue_and_returns() {
    let db = TestDb::new().await;
    let c = TestCoordinator::start(&db).await;
    for i in 0..25 {
        c.api.enqueue("sweep", json!(i)).await;
    }
    let worker = Worker::builder(client(c.api.base()))
        .concurrency(4)
        .claim_wait(Duration::from_millis(200))
        .until_idle(true)
        .handle(q("sweep"), |ctx: JobContext| async move {
            Ok::<_, JobError>(ctx.raw_payload().clone())
        })
        .build()
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(30), worker.run(CancellationToken::new()))
        .await
        .expect("an until-idle worker returns once the queue is drained");
    assert_eq!(report.completed, 25, "{report:?}");
    assert_eq!(report.claims_failed, 0);

    // Nobody listening: it gives up after a few failed claims.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = Worker::builder(client(&format!("http://127.0.0.1:{port}")))
        .until_idle(true)
        .handle(
            q("sweep"),
            |_ctx: JobContext| async move { Ok::<_, JobError>(()) },
        )
        .build()
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(30), unreachable.run(CancellationToken::new()))
        .await
        .expect("returns when the coordinator is unreachable");
    assert_eq!((report.claims_answered, report.completed), (0, 0));
    assert!(report.claims_failed >= 1);
}
