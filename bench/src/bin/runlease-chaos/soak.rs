//! The soak's world and its fault schedule: PostgreSQL (a primary with a
//! synchronous standby), Redis, coordinator processes behind database proxies, worker processes, the endpoint that
//! serves the pushed queue, a producer, and one fault after another until
//! every job is enqueued; then the drain and the verification.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use runlease_tests::{PgCluster, Proxy, Replication, TestRedis};
use tokio::process::{Child, Command};
use uuid::Uuid;

use crate::jobs::{self, Rng};
use crate::process::{Coordinator, signal};
use crate::producer::produce;
use crate::verify::{self, Expect};
use crate::worker;

/// The database the coordinators create on the soak's cluster.
pub const DATABASE: &str = "chaos";

/// The soak's settings.
pub struct SoakArgs {
    /// Jobs to enqueue.
    pub jobs: u64,
    /// Enqueue rate, jobs/s.
    pub rate: f64,
    /// Coordinator processes (2 or 3).
    pub coordinators: usize,
    /// Worker processes at any time.
    pub workers: usize,
    /// Jobs each worker holds at once.
    pub concurrency: usize,
    /// How long Redis stays stopped.
    pub redis_outage: Duration,
    /// The coordinator binary.
    pub coordinator_binary: PathBuf,
    /// Keep the temporary directory (logs, data) even when the soak passes.
    pub keep: bool,
    /// Seed of the victims' choice and the handlers' run times.
    pub seed: u64,
    /// Pause between two faults.
    pub gap: Duration,
    /// Lease TTL of the coordinators, ms.
    pub ttl_ms: u64,
    /// One job in this many stalls past its lease on its first run.
    pub stall_every: u64,
    /// Whether this is the short mode (one round of faults).
    pub short: bool,
    /// The handlers' run time, ms, drawn per job from `lo..=hi`.
    pub work_ms: (u64, u64),
}

impl SoakArgs {
    /// The long soak: 100,000 jobs, every fault repeated while they come in.
    pub fn long() -> Self {
        Self {
            jobs: 100_000,
            rate: 250.0,
            coordinators: 3,
            workers: 8,
            concurrency: 48,
            redis_outage: Duration::from_secs(30),
            coordinator_binary: PathBuf::new(),
            keep: false,
            seed: 15,
            gap: Duration::from_secs(8),
            ttl_ms: 5_000,
            stall_every: 2_000,
            short: false,
            work_ms: (10, 1_000),
        }
    }

    /// The short soak CI runs: every fault once, within about three minutes
    /// with debug binaries.
    pub fn short() -> Self {
        Self {
            jobs: 2_000,
            rate: 25.0,
            workers: 5,
            concurrency: 10,
            work_ms: (20, 1_500),
            redis_outage: Duration::from_secs(10),
            gap: Duration::from_secs(3),
            stall_every: 400,
            short: true,
            ..Self::long()
        }
    }
}

/// A worker process of this binary's `worker` mode.
struct WorkerProc {
    id: String,
    url: String,
    child: Child,
    /// It reaches its coordinator through the partition proxy.
    partitionable: bool,
}

/// The endpoint process: one port for its life, restarted after a kill.
struct EndpointProc {
    port: u16,
    secret: String,
    log: PathBuf,
    child: Option<Child>,
    starts: usize,
}

/// What the schedule did, for the report.
#[derive(Default)]
pub struct Faults {
    /// One line per fault injected.
    pub lines: Vec<String>,
    /// Worker processes SIGKILLed (and replaced).
    pub workers_killed: usize,
    /// Worker processes stopped past their lease.
    pub workers_stopped: usize,
    /// Coordinator processes SIGKILLed and restarted.
    pub coordinators_killed: usize,
    /// Redis outages.
    pub redis_outages: usize,
    /// PostgreSQL restarts that completed.
    pub pg_restarts: usize,
    /// PostgreSQL failovers (primary crashed, standby promoted).
    pub failovers: usize,
    /// Failovers under load after which no enqueue was acknowledged within
    /// 10 s of the promotion (the coordinators must serve again by then).
    pub slow_failovers: Vec<String>,
    /// Worker partitions past the TTL.
    pub partitions: usize,
    /// Database-connection freezes.
    pub freezes: usize,
    /// Endpoint processes SIGKILLed (and restarted).
    pub endpoint_kills: usize,
    /// Workers stopped past their lease (ids).
    pub stopped: Vec<String>,
    /// Workers partitioned past their lease (ids).
    pub partitioned: Vec<String>,
    /// The leases (job id, run lease) the partitioned worker held when its
    /// partition began: reaped behind it, their finishes come back late.
    pub partitioned_leases: Vec<(Uuid, i64)>,
    /// When the last partition healed.
    pub healed_at: Option<Instant>,
    /// Answers 5xx other than 503 the producer got.
    pub producer_server_errors: Vec<String>,
}

struct World {
    dir: PathBuf,
    args: SoakArgs,
    pg: PgCluster,
    redis: TestRedis,
    coordinators: Vec<Coordinator>,
    /// Between the partitionable worker and its coordinator.
    worker_proxy: Proxy,
    workers: Vec<WorkerProc>,
    /// The endpoint serving [`jobs::PUSH_QUEUE`].
    endpoint: EndpointProc,
    /// Every worker log ever written (killed workers' too).
    logs: Vec<PathBuf>,
    worker_serial: usize,
    rng: Rng,
    faults: Faults,
    /// When each enqueue batch was acknowledged (the producer's record).
    acks: Arc<Mutex<Vec<Instant>>>,
    t0: Instant,
}

/// Prints `what` with the time since the soak began.
pub fn say(t0: Instant, what: &str) {
    println!("[{:>7.1} s] {what}", t0.elapsed().as_secs_f64());
}

/// Runs the soak; answers whether every target was met.
pub async fn run(args: SoakArgs) -> anyhow::Result<bool> {
    let dir = std::env::temp_dir().join(format!(
        "runlease-chaos-{}-{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir)?;
    let t0 = Instant::now();
    println!(
        "runlease-chaos: {} jobs at {}/s, {} coordinators ({}), {} workers x {} slots, lease TTL {} ms; files in {}",
        args.jobs,
        args.rate,
        args.coordinators,
        args.coordinator_binary.display(),
        args.workers,
        args.concurrency,
        args.ttl_ms,
        dir.display()
    );
    let mut world = World::build(dir.clone(), args, t0).await?;
    let outcome = world.soak().await;
    world.shutdown().await;
    let keep = world.args.keep;
    let passed = match outcome {
        Ok(passed) => passed,
        Err(e) => {
            println!("the soak could not run to the end: {e:#}");
            println!("logs kept in {}", dir.display());
            drop(world);
            return Err(e);
        }
    };
    drop(world);
    if passed && !keep {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("logs kept in {}", dir.display());
    }
    Ok(passed)
}

impl World {
    async fn build(dir: PathBuf, args: SoakArgs, t0: Instant) -> anyhow::Result<Self> {
        // fsync is off (the soak tests the protocol, not the disk); commits
        // still wait for the standby, so a failover loses nothing acknowledged.
        let pg = PgCluster::start_in(
            &dir.join("pg"),
            Replication::Synchronous,
            "max_connections = 200\nshared_buffers = 128MB",
        )
        .await;
        say(
            t0,
            &format!(
                "PostgreSQL up: primary on port {}, synchronous standby on port {} (logs in {})",
                pg.primary.port,
                pg.standby.port,
                dir.join("pg").display()
            ),
        );
        let redis = TestRedis::start().await;
        say(t0, &format!("Redis up on port {}", redis.port));
        let mut coordinators = Vec::new();
        for index in 0..args.coordinators {
            let mut c = Coordinator {
                index,
                port: runlease_tests::process::free_port(),
                db_proxies: vec![
                    Proxy::start(addr(pg.primary.port)).await,
                    Proxy::start(addr(pg.standby.port)).await,
                ],
                child: None,
                log: dir.join(format!("coordinator-{index}.log")),
                starts: 0,
            };
            // One at a time: the first creates the database and migrates it.
            c.start(&args, &redis).await?;
            coordinators.push(c);
        }
        say(t0, &format!("{} coordinators ready", coordinators.len()));
        let worker_proxy = Proxy::start(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            coordinators[coordinators.len() - 1].port,
        )))
        .await;
        let endpoint =
            EndpointProc::set_up(&dir, &format!("http://127.0.0.1:{}", coordinators[0].port)).await?;
        let rng = Rng::new(args.seed);
        let mut world = Self {
            dir,
            args,
            pg,
            redis,
            coordinators,
            worker_proxy,
            workers: Vec::new(),
            endpoint,
            logs: Vec::new(),
            worker_serial: 0,
            rng,
            faults: Faults::default(),
            acks: Arc::default(),
            t0,
        };
        for i in 0..world.args.workers {
            // The last worker goes through the partition proxy; the others
            // are spread over the coordinators.
            let (url, partitionable) = if i == world.args.workers - 1 {
                (world.worker_proxy.url(), true)
            } else {
                (world.coordinator_url(i % world.coordinators.len()), false)
            };
            let w = world.spawn_worker(url, partitionable)?;
            world.workers.push(w);
        }
        say(t0, &format!("{} workers started", world.workers.len()));
        world.endpoint.start(world.args.work_ms)?;
        say(
            t0,
            &format!(
                "endpoint serving {} on port {}",
                jobs::PUSH_QUEUE,
                world.endpoint.port
            ),
        );
        Ok(world)
    }

    /// A plain connection to the soak's database on the current primary.
    async fn db(&self) -> anyhow::Result<tokio_postgres::Client> {
        let port = self.pg.primary().port;
        self.pg
            .primary()
            .connect(DATABASE)
            .await
            .with_context(|| format!("cannot connect to the soak's PostgreSQL on port {port}"))
    }

    fn coordinator_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.coordinators[i].port)
    }

    fn spawn_worker(&mut self, url: String, partitionable: bool) -> anyhow::Result<WorkerProc> {
        let id = format!("chaos-w{}", self.worker_serial);
        self.worker_serial += 1;
        let log = self.dir.join(format!("{id}.jsonl"));
        let stderr = std::fs::File::create(self.dir.join(format!("{id}.stderr")))?;
        let child = Command::new(std::env::current_exe()?)
            .args(["worker", "--coordinator", &url, "--log"])
            .arg(&log)
            .args(["--id", &id, "--concurrency", &self.args.concurrency.to_string()])
            .args([
                "--work-ms",
                &format!("{}..{}", self.args.work_ms.0, self.args.work_ms.1),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a worker process")?;
        self.logs.push(log);
        Ok(WorkerProc {
            id,
            url,
            child,
            partitionable,
        })
    }

    async fn soak(&mut self) -> anyhow::Result<bool> {
        let urls: Vec<String> = (0..self.coordinators.len())
            .map(|i| self.coordinator_url(i))
            .collect();
        let producer = tokio::spawn(produce(
            urls,
            self.acks.clone(),
            self.args.jobs,
            self.args.rate,
            self.args.stall_every,
            self.t0,
        ));
        let mut round = 0;
        loop {
            round += 1;
            say(self.t0, &format!("fault round {round}"));
            self.fault_round(round).await?;
            if self.args.short || producer.is_finished() {
                break;
            }
        }
        let (enqueue_took, server_errors) = producer.await??;
        self.faults.producer_server_errors = server_errors;
        say(
            self.t0,
            &format!("all {} jobs enqueued ({enqueue_took:?})", self.args.jobs),
        );
        // The last freeze's frozen connections are given up by the
        // coordinators themselves; nothing else is left in a faulty state.
        self.drain().await?;
        let client = self.db().await?;
        // Pushed stall jobs lose their answer at the endpoint instead: only
        // the pulled ones finish late in a worker's log.
        let stalls = (0..self.args.jobs)
            .filter(|n| jobs::queue(*n) == jobs::QUEUE)
            .filter(|n| jobs::Kind::of(*n, self.args.stall_every) == jobs::Kind::Stall)
            .count();
        // The stalled first leases and the leases held across the partition
        // finish late; wait (bounded) for their answers so the report can
        // count their refusals.
        let stalled_by = Instant::now() + Duration::from_millis(self.args.ttl_ms * 2 + 15_000);
        // A partitioned worker's finish may first wait out the connections
        // frozen with the partition (each a request timeout) before a new one
        // reaches the coordinator; the worker logs an answer within its
        // finishing persistence of the heal in any case.
        let partition_by = self
            .faults
            .healed_at
            .map(|at| at + worker::FINISH_PERSISTENCE + Duration::from_secs(15));
        loop {
            let logs = verify::read_logs(&self.logs);
            let stalls_left =
                logs.stalled_finishes(self.args.stall_every) < stalls && Instant::now() < stalled_by;
            let leases = &self.faults.partitioned_leases;
            let partition_left = partition_by.is_some_and(|by| Instant::now() < by)
                && logs.refused(leases) == 0
                && logs.answered(leases) < leases.len();
            if !stalls_left && !partition_left {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        self.stop_workers().await;
        self.endpoint.stop().await;
        let counters = self.coordinator_counters().await;
        self.stop_coordinators().await;
        let expect = Expect {
            jobs: self.args.jobs,
            stall_every: self.args.stall_every,
            slo: Duration::from_secs(25),
            enqueue_took,
            elapsed: self.t0.elapsed(),
        };
        let report = verify::check(&client, &self.logs, &expect).await?;
        println!();
        println!("faults injected:");
        for line in &self.faults.lines {
            println!("  {line}");
        }
        let refused = |ids: &[String]| -> usize {
            ids.iter()
                .map(|id| report.refused_by_worker.get(id).copied().unwrap_or(0))
                .sum()
        };
        let (by_stopped, by_partitioned) = (refused(&self.faults.stopped), refused(&self.faults.partitioned));
        println!(
            "  stale finishes refused: {by_stopped} from the stopped workers, {by_partitioned} from the partitioned worker \
             ({} of the {} leases it held across its partition answered)",
            verify::read_logs(&self.logs).answered(&self.faults.partitioned_leases),
            self.faults.partitioned_leases.len()
        );
        println!("coordinator counters (each since its last start):");
        for (name, value) in &counters {
            println!("  {name:<42} {value}");
        }
        let pushes = endpoint_answers(&self.endpoint.log);
        println!(
            "endpoint answers: {} ok, {} failed (500), {} busy (503), {} lost (no answer), {} bad signatures, {} torn log lines",
            pushes.ok, pushes.failed, pushes.busy, pushes.lost, pushes.bad_signature, pushes.torn
        );
        let mut missing_faults = self.missing_faults();
        if pushes.lost == 0 {
            missing_faults.push("an endpoint answer lost");
        }
        if by_stopped == 0 {
            missing_faults.push("a stale finish from a stopped worker");
        }
        if by_partitioned == 0 {
            missing_faults.push("a stale finish from a partitioned worker");
        }
        report.print(&expect);
        for e in &self.faults.producer_server_errors {
            println!("  the producer got a server error: {e}");
        }
        for slow in &self.faults.slow_failovers {
            println!("  not serving again within 10 s of a promotion: {slow}");
        }
        if !missing_faults.is_empty() {
            println!("faults that did not happen: {}", missing_faults.join(", "));
        }
        if pushes.bad_signature > 0 {
            println!(
                "  the endpoint refused {} pushes as badly signed",
                pushes.bad_signature
            );
        }
        let passed = report.passed()
            && missing_faults.is_empty()
            && self.faults.producer_server_errors.is_empty()
            && self.faults.slow_failovers.is_empty()
            && pushes.bad_signature == 0
            && pushes.ok > 0;
        println!("verdict: {}", if passed { "PASS" } else { "FAIL" });
        Ok(passed)
    }

    fn missing_faults(&self) -> Vec<&'static str> {
        let f = &self.faults;
        [
            (f.workers_killed, "worker SIGKILL"),
            (f.workers_stopped, "worker SIGSTOP past its lease"),
            (f.coordinators_killed, "coordinator SIGKILL"),
            (f.redis_outages, "Redis outage"),
            (f.pg_restarts, "PostgreSQL restart"),
            (f.failovers, "PostgreSQL failover"),
            (f.partitions, "worker partition"),
            (f.freezes, "database connection freeze"),
            (f.endpoint_kills, "endpoint SIGKILL"),
        ]
        .into_iter()
        .filter(|(n, _)| *n == 0)
        .map(|(_, what)| what)
        .collect()
    }

    fn note(&mut self, line: String) {
        say(self.t0, &line);
        self.faults
            .lines
            .push(format!("[{:>7.1} s] {line}", self.t0.elapsed().as_secs_f64()));
    }

    async fn gap(&self) {
        tokio::time::sleep(self.args.gap).await;
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.args.ttl_ms)
    }

    async fn fault_round(&mut self, round: usize) -> anyhow::Result<()> {
        self.gap().await;
        self.kill_worker().await?;
        self.gap().await;
        self.stop_worker().await?;
        self.gap().await;
        self.kill_coordinator(round).await?;
        self.gap().await;
        self.redis_outage().await;
        self.gap().await;
        self.restart_postgres().await?;
        self.gap().await;
        self.fail_over().await?;
        self.gap().await;
        self.partition_worker().await?;
        self.gap().await;
        self.freeze_database(round);
        self.gap().await;
        self.kill_endpoint().await?;
        Ok(())
    }

    /// SIGKILLs the endpoint while it holds requests (when it does within
    /// 10 s), restarts it on the same port a second later.
    async fn kill_endpoint(&mut self) -> anyhow::Result<()> {
        let client = self.db().await?;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            let row = client
                .query_one(
                    "SELECT count(*) FROM jobs WHERE queue = $1 AND state = 'running'",
                    &[&jobs::PUSH_QUEUE],
                )
                .await?;
            if row.get::<_, i64>(0) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.endpoint.stop().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        self.endpoint.start(self.args.work_ms)?;
        self.note(format!(
            "endpoint SIGKILLed mid-request and restarted on port {}",
            self.endpoint.port
        ));
        self.faults.endpoint_kills += 1;
        Ok(())
    }

    /// A worker that is not behind the partition proxy, chosen at random.
    fn victim(&mut self) -> usize {
        let plain: Vec<usize> = (0..self.workers.len())
            .filter(|i| !self.workers[*i].partitionable)
            .collect();
        plain[self.rng.next() as usize % plain.len()]
    }

    async fn kill_worker(&mut self) -> anyhow::Result<()> {
        let i = self.victim();
        let mut w = self.workers.remove(i);
        w.child.start_kill()?;
        let _ = w.child.wait().await;
        let replacement = self.spawn_worker(w.url.clone(), false)?;
        self.note(format!(
            "worker {} SIGKILLed mid-job; {} replaces it",
            w.id, replacement.id
        ));
        self.workers.insert(i, replacement);
        self.faults.workers_killed += 1;
        Ok(())
    }

    /// Waits (up to 30 s) until worker `id` holds a lease: at 25 jobs/s a
    /// worker is often idle in a long-poll, and a fault meant to outlast its
    /// leases needs one to outlast. Only a lease with more than half its TTL
    /// ahead counts: one the worker has just taken or is heartbeating, not
    /// one left behind by a claim whose answer it never got (a claim
    /// committed as the failover broke the coordinator's connection). And
    /// only one claimed over 250 ms ago: a claim just committed may have its
    /// answer still on the way, which the fault would then hold back.
    /// Answers the leases found (job id, run lease), none after 30 s.
    async fn until_holding(&self, id: &str) -> anyhow::Result<Vec<(Uuid, i64)>> {
        let client = self.db().await?;
        let bound = Instant::now() + Duration::from_secs(30);
        let half_ttl = (self.args.ttl_ms / 2) as i64;
        while Instant::now() < bound {
            let held: Vec<(Uuid, i64)> = client
                .query(
                    "SELECT id, run_lease FROM jobs WHERE state = 'running' AND owned_by = $1 \
                     AND lease_expires_at > now() + $2::bigint * interval '1 millisecond' \
                     AND claimed_at < now() - interval '250 milliseconds'",
                    &[&id, &half_ttl],
                )
                .await?
                .iter()
                .map(|row| (row.get(0), row.get(1)))
                .collect();
            if !held.is_empty() {
                return Ok(held);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(Vec::new())
    }

    /// Waits (bounded) until none of `leases` (job id, run lease) is still
    /// running under that lease.
    async fn until_reaped(&self, leases: &[(Uuid, i64)]) -> anyhow::Result<()> {
        let client = self.db().await?;
        let (ids, run_leases): (Vec<Uuid>, Vec<i64>) = leases.iter().copied().unzip();
        let bound = Instant::now() + Duration::from_secs(30);
        while Instant::now() < bound {
            let running: i64 = client
                .query_one(
                    "SELECT count(*) FROM jobs j \
                     JOIN unnest($1::uuid[], $2::bigint[]) AS l(id, run_lease) USING (id, run_lease) \
                     WHERE j.state = 'running'",
                    &[&ids, &run_leases],
                )
                .await?
                .get(0);
            if running == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    async fn stop_worker(&mut self) -> anyhow::Result<()> {
        let i = self.victim();
        // Stopped while it holds a lease, so its finish comes back stale.
        let leases = self.until_holding(&self.workers[i].id.clone()).await?;
        let pid = self.workers[i].child.id().context("the worker exited")?;
        let started = Instant::now();
        signal("STOP", pid)?;
        tokio::time::sleep(self.ttl() + Duration::from_secs(2)).await;
        // Continued only once the reaper has taken those leases back.
        self.until_reaped(&leases).await?;
        signal("CONT", pid)?;
        let stopped_for = started.elapsed();
        let id = self.workers[i].id.clone();
        self.faults.stopped.push(id.clone());
        self.note(format!(
            "worker {id} stopped (SIGSTOP) for {stopped_for:.1?}, past its leases, then continued"
        ));
        self.faults.workers_stopped += 1;
        Ok(())
    }

    async fn kill_coordinator(&mut self, round: usize) -> anyhow::Result<()> {
        let i = round % self.coordinators.len();
        let c = &mut self.coordinators[i];
        if let Some(mut child) = c.child.take() {
            child.start_kill()?;
            let _ = child.wait().await;
        }
        let killed_at = Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        c.start(&self.args, &self.redis).await?;
        let back = killed_at.elapsed();
        self.note(format!(
            "coordinator {i} SIGKILLed and restarted (serving again after {back:.1?})"
        ));
        self.faults.coordinators_killed += 1;
        Ok(())
    }

    async fn redis_outage(&mut self) {
        self.redis.stop();
        tokio::time::sleep(self.args.redis_outage).await;
        self.redis.resume().await;
        let outage = self.args.redis_outage;
        self.note(format!("Redis stopped for {outage:?}, then started again"));
        self.faults.redis_outages += 1;
    }

    /// When the current primary started (`pg_postmaster_start_time()`), as text.
    async fn started_at(&self) -> anyhow::Result<String> {
        let row = self
            .db()
            .await?
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .await?;
        Ok(row.get(0))
    }

    async fn restart_postgres(&mut self) -> anyhow::Result<()> {
        let before = self.started_at().await?;
        // The cluster's commands block: keep the runtime's other tasks (the
        // producer, the proxies) running meanwhile.
        let pg = &self.pg;
        let took =
            tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(pg.restart_primary()));
        let after = self.started_at().await?;
        if before == after {
            bail!("PostgreSQL did not restart (start time {before} unchanged)");
        }
        self.note(format!(
            "PostgreSQL restarted (pg_ctl restart -m fast, {took:.1?})"
        ));
        self.faults.pg_restarts += 1;
        Ok(())
    }

    async fn partition_worker(&mut self) -> anyhow::Result<()> {
        let held = self.ttl() + Duration::from_secs(3);
        let id = self
            .workers
            .iter()
            .find(|w| w.partitionable)
            .map(|w| w.id.clone())
            .unwrap_or_default();
        // Partitioned while it holds a lease, so that lease expires behind
        // the partition and its finish comes back stale once it heals.
        let leases = self.until_holding(&id).await?;
        // Open connections stop forwarding and new ones go nowhere; nothing
        // is closed, so the worker learns of it only by timing out.
        let started = Instant::now();
        self.worker_proxy.blackhole(true);
        self.worker_proxy.freeze();
        tokio::time::sleep(held).await;
        // Healed only once the reaper has taken those leases back, so none
        // of their finishes can land.
        self.until_reaped(&leases).await?;
        self.worker_proxy.blackhole(false);
        self.faults.healed_at = Some(Instant::now());
        self.faults.partitioned.push(id.clone());
        self.faults.partitioned_leases.extend(leases);
        self.note(format!(
            "worker {id} partitioned from its coordinator for {:.1?} (blackhole), then healed",
            started.elapsed()
        ));
        self.faults.partitions += 1;
        Ok(())
    }

    /// Crashes the primary mid-load (`pg_ctl -m immediate`), promotes the
    /// standby a second later, notes how long after the promotion the first
    /// enqueue was acknowledged and the first job completed, then makes a
    /// new synchronous standby from the new primary (on the old primary's
    /// port, so the coordinators' URLs and proxies still name both).
    async fn fail_over(&mut self) -> anyhow::Result<()> {
        let (old, new) = (self.pg.primary.port, self.pg.standby.port);
        let crashed = Instant::now();
        // Under load: an enqueue was acknowledged in the 5 s before.
        let loaded = self
            .acks
            .lock()
            .unwrap()
            .last()
            .is_some_and(|t| crashed.duration_since(*t) < Duration::from_secs(5));
        let pg = &self.pg;
        tokio::task::block_in_place(|| pg.crash_primary());
        tokio::time::sleep(Duration::from_secs(1)).await;
        tokio::task::block_in_place(|| pg.promote_standby());
        let (promoted, promoted_wall) = (Instant::now(), SystemTime::now());
        let client = self.db().await?;
        let bound = promoted + Duration::from_secs(60);
        let (mut enqueue, mut completion) = (None, None);
        while (enqueue.is_none() || completion.is_none()) && Instant::now() < bound {
            if enqueue.is_none() {
                let acks = self.acks.lock().unwrap();
                enqueue = acks.iter().find(|t| **t > promoted).map(|t| *t - promoted);
            }
            if completion.is_none() {
                let first: Option<SystemTime> = client
                    .query_one(
                        "SELECT min(finished_at) FROM jobs WHERE state = 'done' AND finished_at > $1",
                        &[&promoted_wall],
                    )
                    .await?
                    .get(0);
                completion = first.and_then(|t| t.duration_since(promoted_wall).ok());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rebuilt = Instant::now();
        let pg = &mut self.pg;
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(pg.rebuild_standby()));
        let rebuilt = rebuilt.elapsed();
        let after = |d: Option<Duration>| match d {
            Some(d) => format!("{d:.1?}"),
            None => "none within 60 s".to_owned(),
        };
        self.note(format!(
            "PostgreSQL failover: primary (port {old}) crashed (pg_ctl -m immediate), standby (port {new}) promoted 1 s later; \
             first enqueue acknowledged {} after the promotion, first job completed {} after; \
             new synchronous standby made from the new primary on port {old} in {rebuilt:.1?}",
            after(enqueue),
            after(completion)
        ));
        if loaded && enqueue.is_none_or(|d| d > Duration::from_secs(10)) {
            self.faults.slow_failovers.push(format!(
                "the failover at {:.1} s: first enqueue acknowledged {} after the promotion",
                (crashed - self.t0).as_secs_f64(),
                after(enqueue)
            ));
        }
        self.faults.failovers += 1;
        Ok(())
    }

    fn freeze_database(&mut self, round: usize) {
        let i = (round + 1) % self.coordinators.len();
        for proxy in &self.coordinators[i].db_proxies {
            proxy.freeze();
        }
        self.note(format!(
            "coordinator {i}'s open PostgreSQL connections frozen (bytes held, nothing closed)"
        ));
        self.faults.freezes += 1;
    }

    /// Waits until every job is terminal (or a bound passes), saying how
    /// far it got every 10 s.
    async fn drain(&mut self) -> anyhow::Result<()> {
        let client = self.db().await?;
        let bound = Duration::from_secs(180);
        let started = Instant::now();
        let mut said = Instant::now();
        loop {
            let row = client
                .query_one(
                    "SELECT count(*), count(*) FILTER (WHERE state IN ('done', 'failed', 'cancelled')) FROM jobs WHERE queue = ANY($1)",
                    &[&&jobs::QUEUES[..]],
                )
                .await?;
            let (total, terminal): (i64, i64) = (row.get(0), row.get(1));
            if total as u64 >= self.args.jobs && total == terminal {
                say(self.t0, &format!("all {total} jobs terminal"));
                return Ok(());
            }
            if started.elapsed() > bound {
                say(
                    self.t0,
                    &format!(
                        "{terminal} of {total} jobs terminal after {bound:?} of drain; verifying as they are"
                    ),
                );
                return Ok(());
            }
            if said.elapsed() > Duration::from_secs(10) {
                say(self.t0, &format!("draining: {terminal} of {total} terminal"));
                said = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Sums of a few counters over the coordinators' `/metrics`.
    async fn coordinator_counters(&self) -> Vec<(&'static str, f64)> {
        let names = [
            "runlease_leases_expired_total",
            "runlease_lease_lost_total",
            "runlease_db_timeouts_total",
            "runlease_db_unavailable_total",
            "runlease_redis_publish_failures_total",
            "runlease_enqueue_failed_marks_total",
            "runlease_enqueue_failed_repairs_total",
            "runlease_reaper_errors_total",
        ];
        let mut sums: Vec<(&'static str, f64)> = names.iter().map(|n| (*n, 0.0)).collect();
        let http = reqwest::Client::new();
        for i in 0..self.coordinators.len() {
            let url = format!("{}/metrics", self.coordinator_url(i));
            let Ok(response) = http.get(&url).timeout(Duration::from_secs(10)).send().await else {
                continue;
            };
            let Ok(text) = response.text().await else {
                continue;
            };
            for line in text.lines().filter(|l| !l.starts_with('#')) {
                let name = line.split(['{', ' ']).next().unwrap_or("");
                let value: f64 = line
                    .rsplit(' ')
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0);
                if let Some(sum) = sums.iter_mut().find(|(n, _)| *n == name) {
                    sum.1 += value;
                }
            }
        }
        sums
    }

    async fn stop_workers(&mut self) {
        for w in &mut self.workers {
            if let Some(pid) = w.child.id() {
                let _ = signal("CONT", pid);
            }
            let _ = w.child.start_kill();
            let _ = w.child.wait().await;
        }
    }

    async fn stop_coordinators(&mut self) {
        for c in &mut self.coordinators {
            c.stop().await;
        }
    }

    /// Leaves nothing running: called whether the soak passed or not.
    async fn shutdown(&mut self) {
        self.stop_workers().await;
        self.endpoint.stop().await;
        self.stop_coordinators().await;
    }
}

impl EndpointProc {
    /// Serves [`jobs::PUSH_QUEUE`] by an endpoint on a free port (through
    /// the coordinator at `coordinator`) and reads the queue's secret.
    async fn set_up(dir: &std::path::Path, coordinator: &str) -> anyhow::Result<Self> {
        let port = runlease_tests::process::free_port();
        let http = reqwest::Client::new();
        let queue = format!("{coordinator}/v1/queues/{}", jobs::PUSH_QUEUE);
        let set = http
            .patch(&queue)
            .json(&serde_json::json!({"endpoint": {"url": format!("http://127.0.0.1:{port}/"), "timeout_ms": 10_000, "concurrency": 16}}))
            .send()
            .await?;
        if !set.status().is_success() {
            bail!(
                "setting the endpoint answered {}: {}",
                set.status(),
                set.text().await.unwrap_or_default()
            );
        }
        let secret: serde_json::Value = http
            .get(format!("{queue}/endpoint-secret"))
            .send()
            .await?
            .json()
            .await?;
        let secret = secret["secret"]
            .as_str()
            .context("no endpoint secret")?
            .to_owned();
        Ok(Self {
            port,
            secret,
            log: dir.join("endpoint.jsonl"),
            child: None,
            starts: 0,
        })
    }

    fn start(&mut self, work_ms: (u64, u64)) -> anyhow::Result<()> {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log.with_extension("stderr"))?;
        let child = Command::new(std::env::current_exe()?)
            .args([
                "endpoint",
                "--listen",
                &format!("127.0.0.1:{}", self.port),
                "--log",
            ])
            .arg(&self.log)
            .args(["--id", &format!("chaos-e{}", self.starts)])
            .args(["--work-ms", &format!("{}..{}", work_ms.0, work_ms.1)])
            .env("RUNLEASE_ENDPOINT_SECRET", &self.secret)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the endpoint process")?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

/// What the endpoint answered, from its log.
#[derive(Default)]
struct EndpointAnswers {
    ok: usize,
    failed: usize,
    busy: usize,
    lost: usize,
    bad_signature: usize,
    torn: usize,
}

fn endpoint_answers(log: &std::path::Path) -> EndpointAnswers {
    let mut a = EndpointAnswers::default();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    for line in text.lines() {
        let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
            a.torn += 1;
            continue;
        };
        match &record["answer"] {
            v if v == 200 => a.ok += 1,
            v if v == 500 => a.failed += 1,
            v if v == 503 => a.busy += 1,
            v if v == "dropped" => a.lost += 1,
            v if v == "bad_signature" => a.bad_signature += 1,
            _ => a.torn += 1,
        }
    }
    a
}

fn addr(port: u16) -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}
