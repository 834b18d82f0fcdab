//! `churn`: what a burst and a steady stream of jobs leave behind, measured
//! from outside. One coordinator process (this build's release binary, or
//! `--binary`; Redis off) over a fresh database with autovacuum on at
//! PostgreSQL's defaults (turned on for the run if the server has it off:
//! `churn/vacuum.rs`); outside HTTP workers (`--workers`, each claiming up to 8 and
//! finishing them in one `/v1/finish` that carries its next claim).
//!
//! 1. A burst: `--jobs` (300,000) enqueued 1,000 per `POST /v1/jobs/batch`,
//!    then drained by workers started after (its jobs/s is the drain rate
//!    of the next phase). Right after the last completion, `GET /metrics`,
//!    `GET /v1/queues` and `GET /v1/queues/churn` are timed one after the
//!    other every 100 ms (from a thread of their own) for `--sample-s` (60)
//!    seconds: p50/p99/max per 10 s window, and from when on every 10 s
//!    window's p99 is within 5 ms. Beside them, what that latency is made
//!    of: the coordinator's own time per route over the same seconds, and
//!    how late a plain thread of the bench woke from its 10 ms naps
//!    meanwhile (the machine's floor; see `churn/floor.rs`).
//! 2. A steady stream at half the drain rate (one `/v1/jobs/batch` every
//!    100 ms) for `--sample-s` seconds, the workers draining it, the
//!    endpoints timed the same way.
//! 3. The drain with the xmin horizon held: `--pin-jobs` (100,000) drained
//!    again and again, first without, then with a `REPEATABLE READ`
//!    transaction on the same database that took its snapshot before and
//!    holds it through `--pin-minutes` of drains (at least one); the ratio
//!    of the two rates (each phase starts after a `VACUUM` of the jobs).
//!
//! Autovacuum's runs over the jobs table (`pg_stat_user_tables`) are
//! printed with each phase: the figures until then are read over the dead
//! rows the drain left.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use runlease_client::protocol::limits::MAX_BATCH_JOBS;
use runlease_tests::{CoordinatorProcess, TestDb};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::drain::{ClaimAnswer, ClaimBody, FinishAnswer, FinishBody};
use crate::h1::Conn;
use crate::history::enqueue;
use crate::stats::percentile;

mod floor;
mod vacuum;

use vacuum::vacuum_note;

const QUEUE: &str = "churn";
/// Leases a worker claims and finishes at once.
const CLAIM: u32 = 8;
/// The latency the figures are held to, ms.
const TARGET_MS: f64 = 5.0;
/// Seconds per printed window.
const WINDOW_S: usize = 10;
/// Between two samples.
const TICK: Duration = Duration::from_millis(100);
/// Before a worker sends a finish again that failed or was refused.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// What a churn run is told.
pub struct Options {
    /// Jobs of the burst.
    pub jobs: usize,
    /// Outside workers.
    pub workers: usize,
    /// Seconds of sampling after the burst and of the steady stream.
    pub sample_s: u64,
    /// Jobs per drain of the pinned-horizon phase.
    pub pin_jobs: usize,
    /// How long the horizon stays pinned (drains run until then).
    pub pin_minutes: f64,
    /// The coordinator binary.
    pub binary: std::path::PathBuf,
}

/// A worker until `stop`: claim, finish with the next claim riding on the
/// finish, counting the completions answered ok into `done`; over a
/// connection of its own (the bench's lean client, [`Conn`]).
async fn worker(base: Arc<str>, id: usize, done: Arc<AtomicUsize>, stop: CancellationToken) {
    let worker_id = format!("churn-{id}");
    let claim = ClaimBody::new(QUEUE, &worker_id, CLAIM, 500);
    let ride = claim.riding();
    let claim = serde_json::to_vec(&claim).expect("a claim serializes");
    let mut conn = Conn::new(&base);
    let mut held: Vec<String> = Vec::new();
    while !stop.is_cancelled() {
        if held.is_empty() {
            let answer = tokio::select! {
                () = stop.cancelled() => return,
                a = conn.post("/v1/claim", &claim) => a,
            };
            match answer.as_ref().map(|a| (a.is_success(), a.body)) {
                Ok((true, body)) => {
                    if let Ok(a) = serde_json::from_slice::<ClaimAnswer>(body) {
                        held = a.leases.into_iter().map(|l| l.lease_token).collect();
                    }
                }
                _ => tokio::time::sleep(RETRY_PAUSE).await,
            }
            continue;
        }
        let finish = FinishBody::completing(held.iter().map(String::as_str), Some(&ride));
        let body = serde_json::to_vec(&finish).expect("a finish serializes");
        // A finish is safe to repeat with the same tokens, after a pause
        // (the coordinator may be shedding load: a 429 or 503).
        let answer = match conn.post("/v1/finish", &body).await {
            Ok(a) if a.is_success() => serde_json::from_slice::<FinishAnswer>(a.body).ok(),
            _ => None,
        };
        let Some(answer) = answer else {
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        done.fetch_add(answer.ok(), Ordering::Relaxed);
        held = answer.next_tokens();
    }
}

/// The outside workers, and the completions they have seen.
struct Fleet {
    done: Arc<AtomicUsize>,
    stop: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    fn start(base: &str, workers: usize) -> Self {
        let base: Arc<str> = base.into();
        let done = Arc::new(AtomicUsize::new(0));
        let stop = CancellationToken::new();
        let handles = (0..workers)
            .map(|w| tokio::spawn(worker(base.clone(), w, done.clone(), stop.clone())))
            .collect();
        Self { done, stop, handles }
    }

    fn done(&self) -> usize {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits until `n` completions were answered; the time it took from `since`.
    async fn until_done(&self, n: usize, since: Instant) -> Duration {
        while self.done() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        since.elapsed()
    }

    async fn stop(self) {
        self.stop.cancel();
        for h in self.handles {
            let _ = h.await;
        }
    }
}

/// Latencies (ms) of both endpoints, each with its second since the start.
#[derive(Default)]
struct Samples {
    metrics: Vec<(f64, f64)>,
    queues: Vec<(f64, f64)>,
    /// `/v1/queues/{queue}`: one queue's page, its settings read for each
    /// request.
    queue: Vec<(f64, f64)>,
    /// The machine's floor in the same seconds: a sleeper's lateness (ms).
    late: Vec<(f64, f64)>,
    /// The coordinator's own time for each route over the sampling.
    served: Vec<String>,
}

async fn timed_get(http: &reqwest::Client, url: &str) -> f64 {
    let started = Instant::now();
    let response = http.get(url).send().await.unwrap();
    assert!(response.status().is_success(), "GET {url}: {}", response.status());
    response.bytes().await.unwrap();
    started.elapsed().as_secs_f64() * 1e3
}

/// Times `/metrics` and `/v1/queues` every [`TICK`] for `seconds`, from a
/// thread of its own (its own runtime and connections): the workers' tasks
/// do not delay the timing. Meanwhile another thread measures the machine's
/// floor ([`floor::sleeper`]); the coordinator's own durations are read
/// before and after.
async fn sample(base: &str, seconds: u64) -> Samples {
    let base = base.to_owned();
    let sleeper = tokio::task::spawn_blocking(move || floor::sleeper(seconds));
    let mut samples = tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let http = reqwest::Client::builder().http1_only().build().unwrap();
            let metrics = format!("{base}/metrics");
            let before = floor::durations(&http.get(&metrics).send().await.unwrap().text().await.unwrap());
            let mut s = sample_here(&http, &base, seconds).await;
            let after = floor::durations(&http.get(&metrics).send().await.unwrap().text().await.unwrap());
            s.served = floor::ROUTES
                .iter()
                .map(|route| floor::served(&before, &after, route))
                .collect();
            s
        })
    })
    .await
    .unwrap();
    samples.late = sleeper.await.unwrap();
    samples
}

async fn sample_here(http: &reqwest::Client, base: &str, seconds: u64) -> Samples {
    let (metrics, queues) = (format!("{base}/metrics"), format!("{base}/v1/queues"));
    let queue = format!("{base}/v1/queues/{QUEUE}");
    let started = Instant::now();
    let mut ticks = tokio::time::interval(TICK);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut s = Samples::default();
    while started.elapsed() < Duration::from_secs(seconds) {
        ticks.tick().await;
        let at = started.elapsed().as_secs_f64();
        s.metrics.push((at, timed_get(http, &metrics).await));
        s.queues.push((at, timed_get(http, &queues).await));
        s.queue.push((at, timed_get(http, &queue).await));
    }
    s
}

fn stats(ms: &mut [f64]) -> (f64, f64, f64) {
    ms.sort_by(f64::total_cmp);
    (
        percentile(ms, 0.5),
        percentile(ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN),
    )
}

fn within(samples: &[(f64, f64)], from: f64, to: f64) -> Vec<f64> {
    samples
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .map(|(_, ms)| *ms)
        .collect()
}

/// The first second from which every 10 s window (sliding by a second) has
/// its p99 within [`TARGET_MS`]; `None`: never over the samples.
fn settled_at(samples: &[(f64, f64)], seconds: u64) -> Option<usize> {
    let last_start = (seconds as usize).saturating_sub(WINDOW_S);
    let ok: Vec<bool> = (0..=last_start)
        .map(|s| {
            let mut w = within(samples, s as f64, (s + WINDOW_S) as f64);
            w.is_empty() || stats(&mut w).1 <= TARGET_MS
        })
        .collect();
    (0..ok.len()).find(|&s| ok[s..].iter().all(|b| *b))
}

fn print_samples(what: &str, samples: &Samples, seconds: u64) {
    println!("  {what}: ms p50 / p99 / max per {WINDOW_S} s window");
    for (name, s) in [
        ("/metrics", &samples.metrics),
        ("/v1/queues", &samples.queues),
        ("/v1/queues/churn", &samples.queue),
    ] {
        let mut line = format!("    {name}\n      ");
        for w in (0..seconds as usize).step_by(WINDOW_S) {
            let mut ms = within(s, w as f64, (w + WINDOW_S) as f64);
            if ms.is_empty() {
                continue;
            }
            let (p50, p99, max) = stats(&mut ms);
            line.push_str(&format!(
                " | {w:>2}-{:<2}s {p50:.1}/{p99:.1}/{max:.1}",
                w + WINDOW_S
            ));
        }
        let mut all: Vec<f64> = s.iter().map(|(_, ms)| *ms).collect();
        let (p50, p99, max) = stats(&mut all);
        println!("{line}");
        println!(
            "      all: {p50:.2} / {p99:.2} / {max:.1}; p99 ≤ {TARGET_MS} ms in every {WINDOW_S} s window from {}",
            settled_at(s, seconds).map_or("never".to_owned(), |s| format!("{s} s on"))
        );
    }
    println!("    the coordinator's own time (its request_duration_seconds over these seconds):");
    for line in &samples.served {
        println!("      {line}");
    }
    println!("    the machine meanwhile: {}", floor::lateness(&samples.late));
}

/// Enqueues `n` jobs, then drains them with `workers` fresh workers:
/// seconds of the enqueue, and jobs/s of the drain alone.
async fn drain(http: &reqwest::Client, base: &str, workers: usize, n: usize) -> (f64, f64) {
    let started = Instant::now();
    enqueue(http, base, QUEUE, n).await;
    let enqueued = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let fleet = Fleet::start(base, workers);
    let took = fleet.until_done(n, started).await;
    fleet.stop().await;
    (enqueued, n as f64 / took.as_secs_f64())
}

/// A steady stream of `rate` jobs/s for `seconds`: the jobs of each
/// [`TICK`] in batches of at most [`MAX_BATCH_JOBS`] (a faster drain than
/// 20,000 jobs/s makes ticks of more). Answers the jobs enqueued and the
/// batches refused.
async fn stream(http: reqwest::Client, base: String, rate: f64, seconds: u64) -> (usize, usize) {
    let per_tick = (rate * TICK.as_secs_f64()).round().max(1.0) as usize;
    let started = Instant::now();
    let mut ticks = tokio::time::interval(TICK);
    let (mut sent, mut refused) = (0, 0);
    while started.elapsed() < Duration::from_secs(seconds) {
        ticks.tick().await;
        let mut left = per_tick;
        while left > 0 {
            let n = left.min(MAX_BATCH_JOBS);
            left -= n;
            let jobs: Vec<Value> = (0..n).map(|i| json!({"queue": QUEUE, "payload": i})).collect();
            let r = http
                .post(format!("{base}/v1/jobs/batch"))
                .json(&json!({"jobs": jobs}))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                sent += n;
            } else {
                refused += 1;
            }
        }
    }
    (sent, refused)
}

pub async fn report(o: Options) -> anyhow::Result<()> {
    let autovacuum = vacuum::Autovacuum::on().await?;
    let db = TestDb::new().await;
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let process = CoordinatorProcess::start_binary(
        &o.binary,
        &db,
        &[
            ("RUNLEASE_DATABASE_URL", format!("{}{sep}sslmode=disable", db.url)),
            ("RUNLEASE_REDIS_URL", String::new()),
            ("RUST_LOG", "warn".into()),
        ],
    )
    .await;
    let base = process.api.base().to_owned();
    let http = reqwest::Client::builder().http1_only().build()?;
    println!(
        "churn: one coordinator process ({}), {} outside workers (claim {CLAIM}, finish with the next claim)",
        o.binary.display(),
        o.workers
    );

    // 1. The burst: enqueued first (the workers start after), then drained.
    let (enqueued, rate) = drain(&http, &base, o.workers, o.jobs).await;
    println!(
        "1. burst of {} jobs: enqueued in {enqueued:.1} s, drained at {rate:.0} jobs/s; {}",
        o.jobs,
        vacuum_note(&db).await
    );
    let after = sample(&base, o.sample_s).await;
    print_samples(
        &format!("the {} s after the burst", o.sample_s),
        &after,
        o.sample_s,
    );
    println!("    {}", vacuum_note(&db).await);

    // 2. A stream at half the drain rate.
    let fleet = Fleet::start(&base, o.workers);
    let from = fleet.done();
    let producer = tokio::spawn(stream(http.clone(), base.clone(), rate / 2.0, o.sample_s));
    let during = sample(&base, o.sample_s).await;
    let (sent, refused) = producer.await?;
    anyhow::ensure!(refused == 0, "the stream's enqueues were refused {refused} times");
    let started = Instant::now();
    let backlog_gone =
        tokio::time::timeout(Duration::from_secs(60), fleet.until_done(from + sent, started)).await;
    println!(
        "2. stream at {:.0} jobs/s (half the drain) for {} s: {sent} jobs, {}; {}",
        rate / 2.0,
        o.sample_s,
        match backlog_gone {
            Ok(d) => format!("all done {:.1} s after the stream ended", d.as_secs_f64()),
            Err(_) => format!("{} not done 60 s after it ended", from + sent - fleet.done()),
        },
        vacuum_note(&db).await
    );
    print_samples("during the stream", &during, o.sample_s);
    fleet.stop().await;

    // 3. The drain with the horizon pinned, against it unpinned.
    let admin = db.client().await;
    let pin_for = Duration::from_secs_f64(o.pin_minutes * 60.0);
    admin.batch_execute("VACUUM jobs").await?;
    let pinned_start = Instant::now();
    let mut pinned = Vec::new();
    {
        let mut pin = db.client().await;
        let tx = pin
            .build_transaction()
            .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
            .start()
            .await?;
        // The snapshot is taken by the first statement, and held until the end.
        tx.query_one("SELECT count(*) FROM jobs", &[]).await?;
        while pinned.is_empty() || pinned_start.elapsed() < pin_for {
            pinned.push(drain(&http, &base, o.workers, o.pin_jobs).await.1);
        }
        tx.rollback().await?;
    }
    let pinned_for = pinned_start.elapsed();
    let pinned_note = vacuum_note(&db).await;
    admin.batch_execute("VACUUM jobs").await?;
    let mut free = Vec::new();
    for _ in 0..pinned.len() {
        free.push(drain(&http, &base, o.workers, o.pin_jobs).await.1);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let list = |v: &[f64]| v.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(", ");
    println!(
        "3. drains of {} jobs with the xmin horizon pinned for {:.1} min: {} jobs/s; unpinned: {} jobs/s; pinned/unpinned {:.2}× (target ≥ 0.9×); while pinned: {pinned_note}",
        o.pin_jobs,
        pinned_for.as_secs_f64() / 60.0,
        list(&pinned),
        list(&free),
        mean(&pinned) / mean(&free)
    );
    autovacuum.restore();
    Ok(())
}
