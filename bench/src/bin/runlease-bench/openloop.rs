//! `open-loop`: jobs offered at a fixed rate, one enqueue request per job,
//! whatever the answers (an open loop: a slow answer does not slow the
//! offer), to a coordinator build as its own process and to graphile-worker
//! at the same rates.
//!
//! runlease: one `POST /v1/jobs` per job, sent when it is due (`rate` a
//! second for `seconds`), over `connections` keep-alive HTTP/1.1
//! connections (at most that many enqueues in flight; one due while all are
//! busy waits for one, so the bench never opens a storm of connections of
//! its own). The enqueues and the workers use the bench's lean client
//! ([`Conn`]), so the load generator takes as little as it can of the cores
//! it shares with the coordinator and PostgreSQL. `workers` outside HTTP
//! workers (the drain's: claim up to
//! `concurrency`, finish them in one `/v1/finish`, the next claim riding on
//! it where the build answers that) run the jobs. Every time is taken in
//! this process from the moment the enqueue was due (not when it was sent,
//! so a late send counts against the system): enqueue→ack when its answer
//! came, enqueue→start when a worker received the lease (worker-side), and
//! enqueue→done when that worker's finish was answered. The payload carries
//! the due time.
//!
//! graphile-worker (`peer.mjs open-loop`): one `addJob` per job on the same
//! schedule over a pool of `graphile_connections` PostgreSQL connections,
//! a worker pool of `workers` concurrent jobs in a second Node process;
//! enqueue→start when the task function is called, enqueue→done at its
//! `job:complete` event (the success handed to its batched complete).
//!
//! Both report once every acknowledged job is done, or `grace` after the
//! last enqueue was due; a job not started by then counts in neither
//! latency and shows as fewer started than acknowledged, and an enqueue
//! not answered by then counts as not acknowledged.
//!
//! For runlease the CPU of that window is reported too, per job done: its
//! database's backends, the coordinator process and this process (the
//! enqueues and the workers), and the share of the machine's cores that
//! were busy, so a run can tell a system that keeps up from one that had no
//! core to spare.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runlease_tests::{CoordinatorProcess, TestDb};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::drain::{Build, CLAIM_WAIT_MS, ClaimBody, FinishBody, QUEUE, rides};
use crate::h1::Conn;
use crate::stats::{BackendCpu, Cpu, ns_us, percentile, process_ticks, ticks_us};

/// Latencies of one kind, ms from when the enqueue was due.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Lat {
    pub n: usize,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
}

impl Lat {
    fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        let at = |p| (!v.is_empty()).then(|| percentile(&v, p));
        Lat {
            n: v.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: v.last().copied(),
        }
    }
}

/// What one open-loop run measured.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct OpenLoop {
    /// Enqueues due.
    pub offered: usize,
    /// Enqueues answered 2xx (added, for graphile-worker).
    pub acked: usize,
    /// Enqueues answered with an error (a non-2xx status, a refused or
    /// broken connection, a rejected `addJob`) before the deadline.
    #[serde(default)]
    pub failed: usize,
    /// enqueue→acknowledged.
    pub ack: Lat,
    pub start: Lat,
    pub done: Lat,
    /// runlease's CPU over the run (graphile-worker's peer reports none).
    #[serde(default)]
    pub cpu: Option<CpuPerJob>,
}

/// CPU µs per job done, from the first enqueue due to the end of the run,
/// and how busy the machine was meanwhile.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct CpuPerJob {
    /// The run's database's backends.
    pub pg_us: f64,
    /// The coordinator process.
    pub coordinator_us: f64,
    /// This process: the enqueues and the outside workers.
    pub bench_us: f64,
    /// The share of the machine's cores busy, 0 to 1.
    pub machine_busy: f64,
}

/// The CPU counters a run starts from.
struct CpuStart {
    pg: BackendCpu,
    coordinator: u64,
    machine: Cpu,
    at: Instant,
}

impl CpuStart {
    async fn now(db: &str, coordinator: u32) -> Self {
        Self {
            pg: BackendCpu::start(db).await,
            coordinator: process_ticks(coordinator).unwrap_or(0),
            machine: Cpu::now(),
            at: Instant::now(),
        }
    }

    /// What was spent since, per job of `jobs`.
    async fn per_job(self, coordinator: u32, jobs: usize) -> CpuPerJob {
        let n = jobs.max(1) as f64;
        let (machine, wall) = (Cpu::now(), self.at.elapsed());
        let coordinator = process_ticks(coordinator)
            .unwrap_or(0)
            .saturating_sub(self.coordinator);
        CpuPerJob {
            pg_us: ns_us(self.pg.stop().await) / n,
            coordinator_us: ticks_us(coordinator) / n,
            bench_us: machine.per_job_since(self.machine, jobs.max(1)).0,
            machine_busy: machine.busy_share_since(self.machine, wall),
        }
    }
}

impl OpenLoop {
    /// The share of enqueues acknowledged.
    pub fn acked_share(&self) -> f64 {
        self.acked as f64 / self.offered.max(1) as f64
    }
}

/// The open loop's settings, shared by both systems.
#[derive(Debug, Clone, Copy)]
pub struct Offer {
    pub rate: usize,
    pub seconds: u64,
    pub workers: usize,
    pub concurrency: u32,
    /// runlease's keep-alive HTTP connections for the enqueues.
    pub connections: usize,
    /// graphile-worker's PostgreSQL connections for its `addJob` calls.
    pub graphile_connections: usize,
    pub grace: Duration,
}

/// Ms since `t0`.
fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// A job's payload: when its enqueue was due (ms since `t0`).
#[derive(Deserialize)]
struct Due {
    t: f64,
}

#[derive(Deserialize)]
struct Leased {
    lease_token: String,
    payload: Due,
}

#[derive(Deserialize)]
struct Claimed {
    leases: Vec<Leased>,
}

#[derive(Deserialize)]
struct Finished {
    #[serde(default)]
    leases: Option<Vec<Leased>>,
}

/// Jobs done, and a wake-up for whoever waits for them all.
struct Tally {
    done: AtomicUsize,
    changed: Notify,
}

/// An open-loop worker: the drain's loop over a connection of its own
/// ([`Conn`]), timing each job from the due time its payload carries.
/// Answers (start, done) ms.
async fn worker(
    base: Arc<str>,
    id: String,
    max_jobs: u32,
    ride: bool,
    t0: Instant,
    tally: Arc<Tally>,
    stop: CancellationToken,
) -> (Vec<f64>, Vec<f64>) {
    let claim = ClaimBody::new(QUEUE, &id, max_jobs, CLAIM_WAIT_MS);
    let ride_claim = claim.riding();
    let claim = serde_json::to_vec(&claim).expect("a claim serializes");
    let mut conn = Conn::new(&base);
    let (mut starts, mut dones) = (Vec::new(), Vec::new());
    let mut held: Vec<(String, f64)> = Vec::new();
    let mut body = Vec::new();
    let take = |leases: Vec<Leased>, starts: &mut Vec<f64>| -> Vec<(String, f64)> {
        let now = ms_since(t0);
        leases
            .into_iter()
            .map(|l| {
                starts.push(now - l.payload.t);
                (l.lease_token, l.payload.t)
            })
            .collect()
    };
    loop {
        if held.is_empty() {
            let answer = tokio::select! {
                () = stop.cancelled() => return (starts, dones),
                r = conn.post("/v1/claim", &claim) => r,
            };
            let Ok(answer) = answer else { continue };
            let Ok(answer) = serde_json::from_slice::<Claimed>(answer.body) else {
                continue;
            };
            held = take(answer.leases, &mut starts);
            if held.is_empty() {
                continue;
            }
        }
        let finish =
            FinishBody::completing(held.iter().map(|(t, _)| t.as_str()), ride.then_some(&ride_claim));
        body.clear();
        serde_json::to_writer(&mut body, &finish).expect("a finish serializes");
        let answer = tokio::select! {
            () = stop.cancelled() => return (starts, dones),
            r = conn.post("/v1/finish", &body) => r,
        };
        // A finish is safe to repeat with the same tokens: go round again.
        let Ok(answer) = answer else { continue };
        if !answer.is_success() {
            continue;
        }
        let Ok(answer) = serde_json::from_slice::<Finished>(answer.body) else {
            continue;
        };
        let now = ms_since(t0);
        dones.extend(held.iter().map(|(_, due)| now - due));
        tally.done.fetch_add(held.len(), Ordering::Relaxed);
        tally.changed.notify_one();
        held = take(answer.leases.unwrap_or_default(), &mut starts);
    }
}

/// What the enqueue connections saw: the ack times (ms from due) of the
/// enqueues answered 2xx by the deadline, and the errors before it.
#[derive(Default)]
struct Acks {
    ms: Vec<f64>,
    failed: usize,
}

/// One enqueue connection: sends the enqueues due (their due times, ms
/// since `t0`) as they come from `due`, one at a time, until `due` closes.
/// An answer after `deadline` counts as none.
async fn enqueuer(
    base: Arc<str>,
    due: Arc<tokio::sync::Mutex<tokio::sync::mpsc::UnboundedReceiver<f64>>>,
    t0: Instant,
    deadline: Instant,
    acks: Arc<std::sync::Mutex<Acks>>,
) {
    let mut conn = Conn::new(&base);
    let mut body = Vec::new();
    loop {
        let Some(due_ms) = due.lock().await.recv().await else {
            return;
        };
        body.clear();
        serde_json::to_writer(&mut body, &json!({"queue": QUEUE, "payload": {"t": due_ms}}))
            .expect("an enqueue serializes");
        let ok = conn.post("/v1/jobs", &body).await.is_ok_and(|a| a.is_success());
        if Instant::now() > deadline {
            continue;
        }
        let mut acks = acks.lock().expect("not poisoned");
        if ok {
            acks.ms.push(ms_since(t0) - due_ms);
        } else {
            acks.failed += 1;
        }
    }
}

/// One open-loop run of `build` at `offer.rate` on a fresh database.
pub async fn runlease(build: &Build, offer: Offer) -> anyhow::Result<OpenLoop> {
    let db = TestDb::empty().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let env = [("RUNLEASE_DATABASE_URL", format!("{}{sep}sslmode=disable", db.url))];
    let mut process = CoordinatorProcess::start_binary(&build.binary, &db, &env).await;
    let base: Arc<str> = process.api.base().into();
    let http = reqwest::Client::builder()
        .http1_only()
        .timeout(Duration::from_secs(30))
        .build()?;
    let ride = rides(&http, &base).await?;
    let tally = Arc::new(Tally {
        done: AtomicUsize::new(0),
        changed: Notify::new(),
    });
    let stop = CancellationToken::new();
    let pid = process.child.id().expect("the coordinator is running");
    let cpu = CpuStart::now(&db.name, pid).await;
    let t0 = Instant::now();
    let workers: Vec<_> = (0..offer.workers)
        .map(|w| {
            tokio::spawn(worker(
                base.clone(),
                format!("open-loop-{w}"),
                offer.concurrency,
                ride,
                t0,
                tally.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let total = offer.rate * offer.seconds as usize;
    let start = t0 + Duration::from_millis(50);
    // An enqueue still unanswered at the deadline counts as not acknowledged.
    let deadline = start + Duration::from_secs(offer.seconds) + offer.grace;
    let (due, queued) = tokio::sync::mpsc::unbounded_channel();
    let queued = Arc::new(tokio::sync::Mutex::new(queued));
    let acks = Arc::new(std::sync::Mutex::new(Acks::default()));
    let mut enqueuers: Vec<_> = (0..offer.connections)
        .map(|_| tokio::spawn(enqueuer(base.clone(), queued.clone(), t0, deadline, acks.clone())))
        .collect();
    for i in 0..total {
        let at = start + Duration::from_secs_f64(i as f64 / offer.rate as f64);
        tokio::time::sleep_until(at.into()).await;
        due.send((at - t0).as_secs_f64() * 1e3)
            .expect("the enqueuers wait");
    }
    drop(due);
    for e in &mut enqueuers {
        match tokio::time::timeout_at(deadline.into(), e).await {
            Ok(ended) => ended?,
            Err(_) => break,
        }
    }
    enqueuers.iter().for_each(tokio::task::JoinHandle::abort);
    let (acks, failed) = {
        let mut acks = acks.lock().expect("not poisoned");
        (std::mem::take(&mut acks.ms), acks.failed)
    };
    let acked = acks.len();
    while tally.done.load(Ordering::Relaxed) < acked {
        let wait = tally.changed.notified();
        if tokio::time::timeout_at(deadline.into(), wait).await.is_err() {
            break;
        }
    }
    let cpu = cpu.per_job(pid, tally.done.load(Ordering::Relaxed)).await;
    stop.cancel();
    let (mut starts, mut dones) = (Vec::new(), Vec::new());
    for w in workers {
        let (s, d) = w.await?;
        starts.extend(s);
        dones.extend(d);
    }
    process.terminate();
    if tokio::time::timeout(Duration::from_secs(20), process.child.wait())
        .await
        .is_err()
    {
        process.child.kill().await?;
    }
    Ok(OpenLoop {
        offered: total,
        acked,
        failed,
        ack: Lat::of(acks),
        start: Lat::of(starts),
        done: Lat::of(dones),
        cpu: Some(cpu),
    })
}

/// graphile-worker at the same offer (see `graphile::open_loop`).
pub async fn graphile(dir: &Path, offer: Offer) -> anyhow::Result<OpenLoop> {
    crate::graphile::open_loop(
        dir,
        offer.rate,
        offer.seconds,
        offer.workers,
        offer.graphile_connections,
        offer.grace,
    )
    .await
}

/// The p99 enqueue→start target at `rate` (ms), where the issue sets one.
fn p99_target(rate: usize) -> Option<f64> {
    match rate {
        1_000 => Some(20.0),
        5_000 => Some(50.0),
        _ => None,
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}"))
}

/// `p50 / p99 / max` of a latency.
fn lat(l: &Lat) -> String {
    format!("{} / {} / {}", ms(l.p50), ms(l.p99), ms(l.max))
}

/// One run in the report.
struct Row {
    round: usize,
    rate: usize,
    name: String,
    /// runlease's enqueue connections, graphile-worker's pool.
    connections: usize,
    r: OpenLoop,
}

/// Runs every rate for every build and graphile-worker, `rounds` times
/// interleaved, then prints every run and the targets.
pub async fn report(
    builds: &[Build],
    graphile_dir: Option<&Path>,
    rates: &[usize],
    connections: Option<usize>,
    rounds: usize,
    offer: Offer,
) -> anyhow::Result<()> {
    if let Some(dir) = graphile_dir {
        crate::graphile::ensure_installed(dir).await?;
    }
    let mut runs: Vec<Row> = Vec::new();
    for round in 1..=rounds {
        for &rate in rates {
            let connections = connections.unwrap_or((rate / 100).max(8));
            let offer = Offer {
                rate,
                connections,
                ..offer
            };
            let mut systems: Vec<(String, usize)> =
                builds.iter().map(|b| (b.name.clone(), connections)).collect();
            if graphile_dir.is_some() {
                systems.push((GRAPHILE.to_owned(), offer.graphile_connections));
            }
            for (i, (name, connections)) in systems.into_iter().enumerate() {
                let r = match (builds.get(i), graphile_dir) {
                    (Some(b), _) => runlease(b, offer).await?,
                    (None, Some(dir)) => graphile(dir, offer).await?,
                    (None, None) => unreachable!("graphile-worker is listed only with its directory"),
                };
                eprintln!(
                    "  round {round}, {rate} jobs/s: {name}: acked {}/{}, started {}, start {}",
                    r.acked,
                    r.offered,
                    r.start.n,
                    lat(&r.start)
                );
                runs.push(Row {
                    round,
                    rate,
                    name,
                    connections,
                    r,
                });
            }
        }
    }
    print_runs(&runs, rounds, offer);
    print_targets(&runs);
    Ok(())
}

fn peer_of<'a>(runs: &'a [Row], row: &Row) -> Option<&'a OpenLoop> {
    runs.iter()
        .find(|p| p.round == row.round && p.rate == row.rate && p.name == GRAPHILE)
        .map(|p| &p.r)
}

fn print_runs(runs: &[Row], rounds: usize, offer: Offer) {
    println!(
        "runlease-bench open-loop: one enqueue per job, due at a fixed rate for {} s (an open loop: late answers do not slow the offer), {rounds} round(s); runlease: POST /v1/jobs over a keep-alive pool of the connections shown, {} outside HTTP workers claiming up to {} (start = the worker received the lease, done = its /v1/finish answered); graphile-worker 0.17: addJob over a pool of the PostgreSQL connections shown, {} concurrent jobs in its batched mode (start = task function called, done = job:complete); all times ms from when the enqueue was due; failed: answered with an error (the rest of those not acknowledged were unanswered at the deadline); a job not started within {} s of the last enqueue counts in no latency; CPU (runlease only): µs per job done of its database's backends, the coordinator and this process (enqueues and workers), from the first enqueue to the end of the run, and the share of the machine's cores busy meanwhile\n",
        offer.seconds,
        offer.workers,
        offer.concurrency,
        offer.workers,
        offer.grace.as_secs()
    );
    println!(
        "| offered jobs/s | round | system | enqueue connections | acknowledged | failed | started | enqueue→ack p50 / p99 / max | enqueue→start p50 / p99 / max | enqueue→done p50 / p99 / max | p99 start ÷ graphile-worker's | CPU µs/job PG / coordinator / bench | machine busy |"
    );
    println!("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for row in runs {
        let r = &row.r;
        let ratio = match (peer_of(runs, row).and_then(|p| p.start.p99), r.start.p99) {
            (Some(p), Some(t)) if row.name != GRAPHILE && p > 0.0 => format!("{:.2}", t / p),
            _ => "–".to_owned(),
        };
        let (cpu, busy) = r.cpu.map_or_else(
            || ("–".to_owned(), "–".to_owned()),
            |c| {
                (
                    format!("{:.0} / {:.0} / {:.0}", c.pg_us, c.coordinator_us, c.bench_us),
                    format!("{:.0}%", c.machine_busy * 100.0),
                )
            },
        );
        println!(
            "| {} | {} | {} | {} | {:.2}% ({}/{}) | {} | {} | {} | {} | {} | {ratio} | {cpu} | {busy} |",
            row.rate,
            row.round,
            row.name,
            row.connections,
            r.acked_share() * 100.0,
            r.acked,
            r.offered,
            r.failed,
            r.start.n,
            lat(&r.ack),
            lat(&r.start),
            lat(&r.done)
        );
    }
}

fn print_targets(runs: &[Row]) {
    println!("\ntargets (issue #40)\n");
    println!("| offered jobs/s | round | build | target | reads | met |");
    println!("|---:|---:|---|---|---:|---|");
    let yes = |b: bool| if b { "yes" } else { "no" };
    for row in runs.iter().filter(|row| row.name != GRAPHILE) {
        let (r, rate, round, name) = (&row.r, row.rate, row.round, &row.name);
        println!(
            "| {rate} | {round} | {name} | every enqueue acknowledged | {:.2}% | {} |",
            r.acked_share() * 100.0,
            yes(r.acked == r.offered)
        );
        // A p99 over fewer jobs than were offered leaves the unstarted out:
        // it is not met then, whatever it reads.
        let complete = r.start.n >= r.offered;
        if let Some(t) = p99_target(rate) {
            let met = r.start.p99.is_some_and(|p| p <= t) && complete;
            println!(
                "| {rate} | {round} | {name} | p99 enqueue→start ≤ {t:.0} ms | {} ms | {} |",
                ms(r.start.p99),
                yes(met)
            );
        }
        if let Some(p) = peer_of(runs, row) {
            let met = matches!((r.start.p99, p.start.p99), (Some(t), Some(g)) if t <= g) && complete;
            println!(
                "| {rate} | {round} | {name} | p99 enqueue→start ≤ graphile-worker's ({} ms) | {} ms | {} |",
                ms(p.start.p99),
                ms(r.start.p99),
                yes(met)
            );
        }
    }
}

const GRAPHILE: &str = "graphile-worker 0.17";

#[cfg(test)]
mod tests {
    use super::{Lat, OpenLoop, p99_target};

    #[test]
    fn latencies_are_summed_up_from_unsorted_samples() {
        let l = Lat::of((1..=100).rev().map(f64::from).collect());
        assert_eq!(
            (l.n, l.p50, l.p99, l.max),
            (100, Some(51.0), Some(99.0), Some(100.0))
        );
        let none = Lat::of(Vec::new());
        assert_eq!((none.n, none.p50, none.max), (0, None, None));
    }

    #[test]
    fn the_peer_reports_in_the_same_shape() {
        let line = r#"{"offered":600,"acked":598,"failed":2,"send_s":3.0,"ack":{"n":598,"p50":2.2,"p99":9.3,"max":29.0},"start":{"n":598,"p50":3.1,"p99":19.0,"max":33.6},"done":{"n":0,"p50":null,"p99":null,"max":null}}"#;
        let r: OpenLoop = serde_json::from_str(line).unwrap();
        assert_eq!(
            (r.offered, r.acked, r.start.p99, r.done.p50),
            (600, 598, Some(19.0), None)
        );
        assert!(r.cpu.is_none(), "the peer reports no CPU");
        assert!((r.acked_share() - 598.0 / 600.0).abs() < 1e-12);
    }

    #[test]
    fn the_issue_sets_latency_targets_at_two_rates() {
        assert_eq!(p99_target(1_000), Some(20.0));
        assert_eq!(p99_target(5_000), Some(50.0));
        assert_eq!(p99_target(10_000), None);
    }
}
