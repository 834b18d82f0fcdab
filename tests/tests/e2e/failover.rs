//! PostgreSQL failover under steady load: a private primary and a streaming
//! standby (tests/src/pg_cluster.rs), two coordinator processes given both
//! hosts with `target_session_attrs=read-write`, producers and workers over
//! HTTP. The primary is stopped at once (`pg_ctl -m immediate`), the standby
//! promoted; the coordinators are never restarted.
//!
//! With a synchronous standby nothing acknowledged may be lost, no
//! completion may be accepted for a lease the job did not end under, and
//! every background loop must work on the new primary. With asynchronous
//! replication the losses are measured and printed, and at-least-once must
//! still hold.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use runlease_tests::process::coordinator_binary;
use runlease_tests::{Api, CoordinatorProcess, PgCluster, Replication, TestSqs};
use serde_json::{Value, json};
use tokio::sync::Mutex;

/// What the load saw, each with when it was answered.
#[derive(Default)]
struct Seen {
    /// Enqueues answered 201: job id, when answered, and when sent.
    acked: Vec<(String, Instant, Instant)>,
    /// Completions answered 200: job id and the run_lease it ended under.
    completed: Vec<(String, i64, Instant)>,
}

struct Load {
    seen: Mutex<Seen>,
    /// Set to stop the producers.
    stop_producing: AtomicBool,
    /// Set to stop the workers.
    stop: AtomicBool,
}

const QUEUE: &str = "steady";

async fn produce(api: Api, load: Arc<Load>) {
    let mut n = 0u64;
    while !load.stop_producing.load(Ordering::Relaxed) {
        n += 1;
        let sent = Instant::now();
        let (status, body) = api
            .post(
                "/v1/jobs",
                &json!({"queue": QUEUE, "payload": n, "max_attempts": 20}),
            )
            .await;
        if status == 201 {
            let id = body["id"].as_str().unwrap().to_owned();
            load.seen.lock().await.acked.push((id, Instant::now(), sent));
        } else {
            assert_eq!(status, 503, "an enqueue during a failover is 201 or 503: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Claims and completes until stopped; a completion answered 503 is sent
/// again until it is answered 200 or `lease_lost`, as a worker does.
async fn work(api: Api, load: Arc<Load>, worker: String) {
    while !load.stop.load(Ordering::Relaxed) {
        let (status, body) = api
            .post(
                "/v1/claim",
                &json!({"queues": [QUEUE], "worker_id": worker, "max_jobs": 8, "wait_ms": 500}),
            )
            .await;
        if status != 200 {
            assert_eq!(status, 503, "a claim during a failover is 200 or 503: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        for lease in body["leases"].as_array().unwrap() {
            complete(&api, &load, lease).await;
        }
    }
}

async fn complete(api: &Api, load: &Load, lease: &Value) {
    let token = lease["lease_token"].as_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let (status, body) = api
            .post("/v1/complete", &json!({"lease_token": token, "result": "ok"}))
            .await;
        match status {
            200 => {
                let id = lease["job_id"].as_str().unwrap().to_owned();
                let run_lease = lease["run_lease"].as_i64().unwrap();
                load.seen
                    .lock()
                    .await
                    .completed
                    .push((id, run_lease, Instant::now()));
                return;
            }
            409 => return,
            _ => {
                assert_eq!(status, 503, "a completion during a failover: {body}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The sum of every sample of metric `name` (all label sets).
async fn metric_sum(api: &Api, name: &str) -> f64 {
    let (_, text) = api.get_text("/metrics").await;
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until `check` holds, polling, for at most `within`.
async fn until<F, Fut>(what: &str, within: Duration, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The coordinators, their load, and the cluster under them.
struct Rig {
    cluster: PgCluster,
    sqs: TestSqs,
    later_url: String,
    coordinators: Vec<CoordinatorProcess>,
    load: Arc<Load>,
    producers: Vec<tokio::task::JoinHandle<()>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

async fn rig(replication: Replication) -> Rig {
    let cluster = PgCluster::start(replication).await;
    let sqs = TestSqs::start().await;
    let later_url = sqs.create_queue("later").await;
    let name = format!("failover-{}", uuid::Uuid::new_v4().simple());
    let mut env = sqs.env();
    env.extend([
        ("RUNLEASE_SQS_QUEUES", format!("later={later_url}")),
        ("RUNLEASE_SQS_DISPATCH_INTERVAL_MS", "200".into()),
        ("RUNLEASE_LEASE_TTL_MS", "3000".into()),
        ("RUNLEASE_HEARTBEAT_INTERVAL_MS", "1000".into()),
        ("RUNLEASE_REAPER_INTERVAL_MS", "200".into()),
        ("RUNLEASE_REPAIR_INTERVAL_MS", "200".into()),
        ("RUNLEASE_PRUNE_INTERVAL_MS", "200".into()),
        ("RUNLEASE_RETENTION_DONE_MS", "0".into()),
        ("RUNLEASE_RETENTION_FAILED_MS", "1000".into()),
    ]);
    let url = cluster.url("runlease");
    let mut coordinators = Vec::new();
    for _ in 0..2 {
        coordinators.push(CoordinatorProcess::start_url(&coordinator_binary(), &url, &name, &env).await);
    }
    let load = Arc::new(Load {
        seen: Mutex::default(),
        stop_producing: AtomicBool::new(false),
        stop: AtomicBool::new(false),
    });
    let (mut producers, mut workers) = (Vec::new(), Vec::new());
    for (i, c) in coordinators.iter().enumerate() {
        producers.push(tokio::spawn(produce(c.api.clone(), load.clone())));
        for w in 0..2 {
            workers.push(tokio::spawn(work(
                c.api.clone(),
                load.clone(),
                format!("w{i}-{w}"),
            )));
        }
    }
    Rig {
        cluster,
        sqs,
        later_url,
        coordinators,
        load,
        producers,
        workers,
    }
}

/// Times from the promotion to the first enqueue and the first completion
/// acknowledged after it.
struct Recovery {
    first_enqueue: Duration,
    first_completion: Duration,
}

impl Rig {
    async fn until_completed(&self, n: usize) {
        until(&format!("{n} completions"), Duration::from_secs(30), || async {
            self.load.seen.lock().await.completed.len() >= n
        })
        .await;
    }

    /// Crashes the primary, promotes the standby a second later (as a
    /// failover manager would after noticing), and waits until enqueues and
    /// completions are acknowledged again.
    async fn fail_over(&self) -> (Instant, Recovery) {
        self.cluster.crash_primary();
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.cluster.promote_standby();
        let promoted = Instant::now();
        let first = |seen: &Seen| {
            let enqueue = seen.acked.iter().map(|a| a.1).find(|t| *t > promoted);
            let completion = seen.completed.iter().map(|c| c.2).find(|t| *t > promoted);
            enqueue.zip(completion)
        };
        until(
            "enqueues and completions acknowledged after the promotion",
            Duration::from_secs(30),
            || async { first(&*self.load.seen.lock().await).is_some() },
        )
        .await;
        let (enqueue, completion) = first(&*self.load.seen.lock().await).unwrap();
        (
            promoted,
            Recovery {
                first_enqueue: enqueue - promoted,
                first_completion: completion - promoted,
            },
        )
    }

    /// Stops the producers and waits until their last enqueue is answered.
    async fn stop_producing(&mut self) {
        self.load.stop_producing.store(true, Ordering::Relaxed);
        for task in self.producers.drain(..) {
            task.await.unwrap();
        }
    }

    /// Stops the workers and waits for them.
    async fn stop_working(&mut self) {
        self.load.stop.store(true, Ordering::Relaxed);
        for task in self.workers.drain(..) {
            task.await.unwrap();
        }
    }

    async fn new_primary(&self) -> tokio_postgres::Client {
        let (client, conn) =
            tokio_postgres::connect(&self.cluster.standby.url("runlease"), tokio_postgres::NoTls)
                .await
                .unwrap();
        tokio::spawn(conn);
        client
    }

    /// Each acknowledged job's state and run_lease on the new primary
    /// (absent: lost), once no acknowledged job that survived is left
    /// unfinished (the workers keep working until then).
    async fn settled(&mut self) -> HashMap<String, (String, i64)> {
        self.stop_producing().await;
        let db = self.new_primary().await;
        let ids: Vec<uuid::Uuid> = {
            let seen = self.load.seen.lock().await;
            seen.acked.iter().map(|a| a.0.parse().unwrap()).collect()
        };
        let query = "SELECT id::text, state::text, run_lease FROM jobs WHERE id = ANY($1)";
        until(
            "every acknowledged job that survived done",
            Duration::from_secs(60),
            || async {
                let rows = db.query(query, &[&ids]).await.unwrap();
                rows.iter().all(|r| r.get::<_, String>(1) == "done")
            },
        )
        .await;
        self.stop_working().await;
        let rows = db.query(query, &[&ids]).await.unwrap();
        rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2)))).collect()
    }
}

/// Each background loop does its work on the new primary: the reaper, the
/// pruner, the scheduler, the repair loop, SQS dispatch and the recount.
async fn background_loops_work(rig: &Rig, ticks_before: f64) {
    let api = &rig.coordinators[0].api;
    let apis: Vec<&Api> = rig.coordinators.iter().map(|c| &c.api).collect();
    let sum = |name: &'static str| {
        let apis = apis.clone();
        async move {
            let mut total = 0.0;
            for api in apis {
                total += metric_sum(api, name).await;
            }
            total
        }
    };

    // Scheduler: the every-second schedule fires again.
    until(
        "a schedule fire on the new primary",
        Duration::from_secs(15),
        || async { sum("runlease_schedule_fires_total").await > ticks_before },
    )
    .await;

    // Reaper: a lease left to expire is reaped.
    let abandoned = api.enqueue_attempts("abandoned", json!(1), 5).await;
    let lease = api.claim_wait("abandoned", "gone", 1, 5000).await.remove(0);
    assert_eq!(lease.job_id, abandoned.id);
    runlease_tests::api::until(api, abandoned.id, "reaped back to queued", |j| {
        j.state.as_str() == "queued"
    })
    .await;

    // Pruner: a failed job past its retention (1 s) is deleted.
    let doomed = api.enqueue_attempts("doomed", json!(1), 1).await;
    let lease = api.claim_wait("doomed", "w", 1, 5000).await.remove(0);
    assert_eq!(api.fail(&lease, "no", false, None).await.0, 200);
    until("the failed job pruned", Duration::from_secs(15), || async {
        api.get(&format!("/v1/jobs/{}", doomed.id)).await.0 == 404
    })
    .await;

    // SQS dispatch: a job due in 1.5 s wakes its Lambda queue when due.
    let (status, later) = api
        .post(
            "/v1/jobs",
            &json!({"queue": "later", "payload": 1, "delay_ms": 1500}),
        )
        .await;
    assert_eq!(status, 201);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut woken = Vec::new();
    while woken.is_empty() && Instant::now() < deadline {
        woken.extend(rig.sqs.receive(&rig.later_url, 1).await);
    }
    if woken.is_empty() {
        let db = rig.new_primary().await;
        let id: uuid::Uuid = later["id"].as_str().unwrap().parse().unwrap();
        let row = db
            .query_one("SELECT state::text, run_at::text, dispatched_run_at::text, now()::text FROM jobs WHERE id = $1", &[&id])
            .await
            .unwrap();
        let (_, m0) = rig.coordinators[0].api.get_text("/metrics").await;
        let (_, m1) = rig.coordinators[1].api.get_text("/metrics").await;
        let sqs: Vec<&str> = m0
            .lines()
            .chain(m1.lines())
            .filter(|l| l.contains("sqs"))
            .collect();
        panic!(
            "no wake-up: {:?} {:?} {:?} {:?} {sqs:?}",
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, Option<String>>(2),
            row.get::<_, String>(3)
        );
    }
    assert_eq!(
        woken.len(),
        1,
        "one wake-up for the due job within 20 s: {woken:?}"
    );

    // Repair and recount: a job set enqueue_failed by hand (outside the
    // coordinator, which also asks for a recount) is queued again.
    let repairs = sum("runlease_enqueue_failed_repairs_total").await;
    let recounts = sum("runlease_tally_recounts_total").await;
    let stuck = api.enqueue("repairs", json!(1)).await;
    let id: uuid::Uuid = stuck.id.to_string().parse().unwrap();
    let db = rig.new_primary().await;
    db.execute("UPDATE jobs SET state = 'enqueue_failed' WHERE id = $1", &[&id])
        .await
        .unwrap();
    until(
        "the enqueue_failed job repaired",
        Duration::from_secs(15),
        || async { sum("runlease_enqueue_failed_repairs_total").await > repairs },
    )
    .await;
    until(
        "a recount after the change by hand",
        Duration::from_secs(75),
        || async { sum("runlease_tally_recounts_total").await > recounts },
    )
    .await;
}

#[tokio::test]
async fn a_synchronous_standby_promoted_under_load_loses_nothing_acknowledged() {
    let mut rig = rig(Replication::Synchronous).await;
    let api = rig.coordinators[0].api.clone();
    let (status, body) = api
        .put(
            "/v1/schedules/tick",
            &json!({"queue": "ticks", "cron": "* * * * * *", "payload": 1}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (_, ready) = api.get("/readyz").await;
    let primary = format!("127.0.0.1:{}", rig.cluster.primary.port);
    assert_eq!(ready["postgres_server"], json!(primary), "{ready}");

    rig.until_completed(200).await;
    let (_promoted, recovery) = rig.fail_over().await;
    let ticks = {
        let mut total = 0.0;
        for c in &rig.coordinators {
            total += metric_sum(&c.api, "runlease_schedule_fires_total").await;
        }
        total
    };
    assert!(
        recovery.first_enqueue < Duration::from_secs(10),
        "enqueues acknowledged again {:?} after the promotion",
        recovery.first_enqueue
    );
    for c in &rig.coordinators {
        let (status, ready) = c.api.get("/readyz").await;
        let standby = format!("127.0.0.1:{}", rig.cluster.standby.port);
        assert_eq!(
            (status, &ready["postgres_server"]),
            (200, &json!(standby)),
            "{ready}"
        );
    }
    let want = rig.load.seen.lock().await.completed.len() + 200;
    rig.until_completed(want).await;
    background_loops_work(&rig, ticks).await;

    let jobs = rig.settled().await;
    let seen = rig.load.seen.lock().await;
    let lost: Vec<_> = seen
        .acked
        .iter()
        .filter(|a| !jobs.contains_key(&a.0))
        .map(|(id, at, _)| {
            (
                id,
                at.checked_duration_since(_promoted),
                _promoted.checked_duration_since(*at),
            )
        })
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged enqueues lost (id, after promotion, before promotion): {lost:?}"
    );
    let stale: Vec<_> = seen
        .completed
        .iter()
        .filter(|(id, run_lease, _)| jobs.get(id).is_some_and(|(_, ended)| ended != run_lease))
        .collect();
    assert!(
        stale.is_empty(),
        "completions accepted for a lease the job did not end under: {stale:?}"
    );
    eprintln!(
        "synchronous standby: {} enqueues and {} completions acknowledged; after the promotion the first enqueue was acknowledged in {:?}, the first completion in {:?}; none lost",
        seen.acked.len(),
        seen.completed.len(),
        recovery.first_enqueue,
        recovery.first_completion
    );
}

#[tokio::test]
async fn an_asynchronous_standby_promoted_under_load_keeps_at_least_once() {
    let mut rig = rig(Replication::Asynchronous).await;
    rig.until_completed(300).await;
    // The standby falls behind: what the primary acknowledges from here on
    // is lost with it.
    let cutting = Instant::now();
    rig.cluster.cut_standby_off().await;
    let cut = Instant::now();
    let (acked, completed) = {
        let seen = rig.load.seen.lock().await;
        (seen.acked.len(), seen.completed.len())
    };
    until(
        "100 enqueues and completions acknowledged past the standby",
        Duration::from_secs(30),
        || async {
            let seen = rig.load.seen.lock().await;
            seen.acked.len() >= acked + 100 && seen.completed.len() >= completed + 100
        },
    )
    .await;
    let (promoted, recovery) = rig.fail_over().await;
    let want = rig.load.seen.lock().await.completed.len() + 200;
    rig.until_completed(want).await;

    let jobs = rig.settled().await;
    let seen = rig.load.seen.lock().await;
    // Every enqueue sent and acknowledged while the standby was cut off is
    // gone; every one acknowledged before the cut began is there (one sent
    // before the cut may have committed, and reached the standby, before it
    // whenever its answer came).
    for (id, at, sent) in &seen.acked {
        let lost = !jobs.contains_key(id);
        if *sent > cut && *at < promoted {
            assert!(
                lost,
                "job {id}, acknowledged while the standby was cut off, survived"
            );
        } else if *at < cutting || *at > promoted {
            assert!(
                !lost,
                "job {id}, acknowledged while the standby streamed, was lost"
            );
        }
    }
    let lost_enqueues = seen.acked.iter().filter(|a| !jobs.contains_key(&a.0)).count();
    // A completion lost with the primary leaves its job running under that
    // lease: it expires and the job runs again. At-least-once holds: every
    // job that survived ends done, never under a lease older than one whose
    // completion was acknowledged.
    let mut lost_completions = 0;
    for (id, run_lease, at) in &seen.completed {
        if let Some((state, ended)) = jobs.get(id) {
            assert_eq!(state, "done", "job {id}");
            assert!(
                ended >= run_lease,
                "job {id} ended under lease {ended}, older than the acknowledged {run_lease}"
            );
            if *at > cut && *at < promoted {
                lost_completions += 1;
            }
        }
    }
    assert!(
        lost_enqueues >= 100,
        "the cut-off standby lost what was acknowledged after it"
    );
    eprintln!(
        "asynchronous standby cut off for {:?}: {} enqueues and {} completions acknowledged in all; lost with the primary: {lost_enqueues} acknowledged enqueues (never run), {lost_completions} acknowledged completions of surviving jobs (each ran again and ended done); first enqueue acknowledged {:?} and first completion {:?} after the promotion",
        promoted - cut,
        seen.acked.len(),
        seen.completed.len(),
        recovery.first_enqueue,
        recovery.first_completion
    );
}

#[tokio::test]
async fn a_read_only_server_is_never_written_and_fresh_connections_find_the_writable_one() {
    let db = runlease_tests::TestDb::new().await;
    let c = runlease_tests::TestCoordinator::start(&db).await;
    let admin = runlease_tests::admin().await;
    let terminate = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{}' AND pid <> pg_backend_pid()",
        db.name
    );
    // The server turns read-only for new sessions (as a standby is), and the
    // coordinator's sessions are cut, so every new one lands read-only.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            db.name
        ))
        .await
        .unwrap();
    admin.batch_execute(&terminate).await.unwrap();
    until(
        "the coordinator reports the read-only server",
        Duration::from_secs(10),
        || async {
            let (status, body) = c.api.get("/readyz").await;
            status == 503
                && body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("accepts no writes"))
        },
    )
    .await;
    let before = db.scalar("SELECT count(*) FROM jobs", &[]).await;
    let (status, body) = c.api.post("/v1/jobs", &json!({"queue": "q", "payload": 1})).await;
    assert_eq!(
        status, 503,
        "a write on a read-only server is refused with 503: {body}"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM jobs", &[]).await,
        before,
        "nothing written"
    );
    assert!(
        metric_sum(&c.api, "runlease_db_retries_total").await >= 1.0,
        "retried on fresh connections"
    );

    // Writable again: the next write drops the read-only connections and
    // goes through on a fresh one, without a restart.
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" RESET default_transaction_read_only",
            db.name
        ))
        .await
        .unwrap();
    until("enqueues acknowledged again", Duration::from_secs(10), || async {
        c.api
            .post("/v1/jobs", &json!({"queue": "q", "payload": 2}))
            .await
            .0
            == 201
    })
    .await;
    let (status, ready) = c.api.get("/readyz").await;
    assert_eq!(status, 200, "{ready}");
    assert!(
        ready["postgres_server"]
            .as_str()
            .is_some_and(|s| s.ends_with(":5432")),
        "{ready}"
    );
}
