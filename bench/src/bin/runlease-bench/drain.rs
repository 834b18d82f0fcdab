//! `--drain [NAME=]BINARY[,...]`: how fast coordinator builds drain a
//! preloaded queue through HTTP, against the PostgreSQL roofline
//! (`roofline.rs`) measured in the same run.
//!
//! Each build runs as its own process on a fresh database it migrates
//! itself, with its default settings (only the database URL is given, with
//! `sslmode=disable` like the roofline's pgbench, and the harness's secret
//! and port). The workers are outside it, in this process: bare protocol
//! loops over one HTTP client that claim up to `--concurrency` leases and
//! complete them all in one `POST /v1/finish`. A build that answers a finish
//! carrying `claim` with `leases` gets the next claim on the finish itself
//! (one request per cycle, the ride claim with `wait_ms: 0` so a finish is
//! never held back; a worker with nothing goes back to a long-poll claim);
//! this is found out once per build, on a probe job of another queue, and
//! printed as the build's mode.
//!
//! A run: `--jobs` jobs enqueued 1,000 per `POST /v1/jobs/batch` (not in the
//! drain figure), a pause of 11 s so every backend has published its
//! counters, then the workers start; the drain ends when the workers have
//! seen the last job's completion answered. Per run:
//! - drain jobs/s, and × the roofline run just before it;
//! - PostgreSQL transactions per job: `pg_stat_database` of the run's
//!   database over the drain, read after the coordinator process exited;
//! - PostgreSQL shared buffers touched per job (`blks_hit + blks_read`,
//!   read with the transactions): a count of pages visited that, unlike
//!   CPU time, does not drift with the machine's speed;
//! - WAL bytes per job over the drain and over enqueue + drain: the run's
//!   database's own (its records and its transactions' commits, read back
//!   with pg_waldump), and the server's (`pg_current_wal_lsn()`, which other
//!   clients of the same server add to);
//! - CPU µs per job over the drain, from `/proc`: PostgreSQL's backends of
//!   the run's database (to the nanosecond, from their `schedstat`), the
//!   whole server (the postmaster and its children, its other clients' work
//!   included), the coordinator process, and this process (the workers);
//! - HTTP requests per job (claims and finishes sent);
//! - claim→complete p50/p99 as the workers see it (claim answered → finish
//!   answered), and enqueue→start p50/p99 from the rows (`created_at` →
//!   `claimed_at`, counted from the drain's start for jobs enqueued before it).
//!
//! Rounds interleave the builds and a roofline run before each drain; the
//! table is the medians of `--repeat` rounds. PostgreSQL's per-statement
//! times (`pg_stat_statements`) are not measured: the module must be in the
//! server's `shared_preload_libraries`, which takes a restart of the server.

mod lean;
mod run;

use std::path::PathBuf;
use std::time::Duration;

use crate::roofline::{self, Roofline};
use crate::stats::{med, median};

pub(crate) use lean::{ClaimAnswer, ClaimBody, FinishAnswer, FinishBody, Fleet, rides};
pub(crate) use run::drain;

/// Which build (its index) ran with how many workers.
type BuildWorkers = (usize, usize, usize);

/// Queue the drained jobs are on.
pub(crate) const QUEUE: &str = "bench";
/// A long-poll claim's wait when a worker holds nothing.
pub(crate) const CLAIM_WAIT_MS: u64 = 1_000;
/// How long after the enqueue the counters are read: an idle backend
/// publishes its counters within ten seconds.
pub(crate) const SETTLE: Duration = Duration::from_secs(11);

/// A coordinator build to drain with.
#[derive(Debug, Clone)]
pub struct Build {
    /// What the table calls it.
    pub name: String,
    /// Its `runlease-coordinator` binary.
    pub binary: PathBuf,
}

impl Build {
    /// `NAME=PATH` or `PATH` (named by the path as given).
    pub fn parse(spec: &str) -> Self {
        match spec.split_once('=') {
            Some((name, path)) => Build {
                name: name.to_owned(),
                binary: path.into(),
            },
            None => Build {
                name: spec.to_owned(),
                binary: spec.into(),
            },
        }
    }
}

/// What drains in a round: a coordinator build, or graphile-worker.
#[derive(Debug, Clone)]
pub enum System {
    /// A coordinator build, driven over HTTP.
    Coordinator(Build),
    /// graphile-worker from its peer directory (`bench/peers/graphile-worker`:
    /// `peer.mjs` and its `node_modules`).
    Graphile(PathBuf),
}

impl System {
    fn name(&self) -> &str {
        match self {
            System::Coordinator(b) => &b.name,
            System::Graphile(_) => "graphile-worker 0.17",
        }
    }
}

/// What one drain measured (per job unless said otherwise).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) jobs_per_s: f64,
    pub(crate) mode: &'static str,
    pub(crate) xacts: f64,
    /// Shared buffers PostgreSQL's backends touched (drain).
    pub(crate) buffers: f64,
    /// WAL bytes: drain, enqueue + drain.
    pub(crate) wal: (f64, f64),
    /// WAL bytes of the run's database alone (pg_waldump): drain, enqueue + drain.
    pub(crate) db_wal: (f64, f64),
    /// PostgreSQL CPU µs: the database's backends, the whole server.
    pub(crate) pg_cpu: (f64, f64),
    /// PostgreSQL CPU µs of the database's backends over the enqueue
    /// (batches of 1,000 through `/v1/jobs/batch`; NaN: not measured).
    pub(crate) pg_enqueue_cpu: f64,
    pub(crate) coordinator_cpu: f64,
    pub(crate) bench_cpu: f64,
    pub(crate) requests: f64,
    /// ms p50, p99.
    pub(crate) claim_to_complete: (f64, f64),
    pub(crate) enqueue_to_start: (f64, f64),
}

/// A system's name in the report, with its coordinator count beyond one.
fn label(system: &System, coordinators: usize) -> String {
    if coordinators > 1 {
        format!("{}, {coordinators} coordinators", system.name())
    } else {
        system.name().to_owned()
    }
}

pub(crate) fn mode_label(ride: bool) -> &'static str {
    if ride { "finish+claim" } else { "claim, finish" }
}

fn print_roofline(r: &Roofline, label: &str) {
    eprintln!(
        "  {label}roofline: {:.0} jobs/s, {:.3} xacts/job, {:.1} buffers/job, WAL {:.0}/{:.0} B/job (server {:.0}/{:.0}), PG CPU {:.1}/{:.1} µs/job",
        r.jobs_per_s,
        r.xacts_per_job,
        r.buffers_per_job,
        r.db_wal_per_job.0,
        r.db_wal_per_job.1,
        r.wal_per_job.0,
        r.wal_per_job.1,
        r.pg_cpu.0,
        r.pg_cpu.1
    );
}

pub async fn report(
    systems: &[System],
    workers: &[usize],
    jobs: usize,
    concurrency: usize,
    rounds: usize,
    coordinators: &[usize],
) -> anyhow::Result<Option<f64>> {
    let concurrency = u32::try_from(concurrency)?;
    let durability = roofline::durability().await?;
    for s in systems {
        match s {
            System::Coordinator(b) => anyhow::ensure!(
                b.binary.exists(),
                "{}: no such binary {}",
                b.name,
                b.binary.display()
            ),
            System::Graphile(dir) => anyhow::ensure!(
                dir.join("node_modules/graphile-worker").exists(),
                "no graphile-worker in {} (npm ci there first)",
                dir.display()
            ),
        }
    }
    // (build, workers) → runs, each with the roofline run just before it.
    let mut runs: Vec<(BuildWorkers, Vec<(Run, f64)>)> = Vec::new();
    let mut rooflines: Vec<Roofline> = Vec::new();
    // One steady-loop roofline per round, before its drains.
    let mut steady: Vec<Roofline> = Vec::new();
    for round in 0..rounds {
        let s = roofline::run_shape(roofline::Shape::Steady, jobs).await?;
        print_roofline(&s, &format!("round {}: steady ", round + 1));
        steady.push(s);
        for &w in workers {
            for (b, system) in systems.iter().enumerate() {
                for &k in coordinators {
                    if k > 1 && matches!(system, System::Graphile(_)) {
                        continue;
                    }
                    let r = roofline::run(jobs).await?;
                    print_roofline(&r, &format!("round {}: ", round + 1));
                    let d = match system {
                        System::Coordinator(build) => drain(build, w, jobs, concurrency, k).await?,
                        System::Graphile(dir) => crate::graphile::drain(dir, w, jobs).await?,
                    };
                    eprintln!(
                        "  round {}: {}, {w} workers ({}): {:.0} jobs/s, ×{:.2} roofline, {:.3} xacts/job, {:.1} buffers/job, WAL {:.0}/{:.0} B/job (server {:.0}/{:.0}), PG CPU {:.1}/{:.1} µs/job, coordinator {:.1} µs/job, {:.3} req/job",
                        round + 1,
                        label(system, k),
                        d.mode,
                        d.jobs_per_s,
                        d.jobs_per_s / r.jobs_per_s,
                        d.xacts,
                        d.buffers,
                        d.db_wal.0,
                        d.db_wal.1,
                        d.wal.0,
                        d.wal.1,
                        d.pg_cpu.0,
                        d.pg_cpu.1,
                        d.coordinator_cpu,
                        d.requests
                    );
                    let ratio = d.jobs_per_s / r.jobs_per_s;
                    match runs.iter_mut().find(|(key, _)| *key == (b, w, k)) {
                        Some((_, v)) => v.push((d, ratio)),
                        None => runs.push(((b, w, k), vec![(d, ratio)])),
                    }
                    rooflines.push(r);
                }
            }
        }
    }

    println!(
        "runlease-bench --drain: {jobs} preloaded jobs per run, drained by outside HTTP workers claiming up to {concurrency} and completing them in one /v1/finish; each coordinator build its own process on a fresh database, default settings; medians of {rounds} interleaved rounds, a roofline run before every drain"
    );
    println!(
        "roofline: pgbench, 16 clients, claim 100 with FOR UPDATE SKIP LOCKED then a guarded complete of those 100, over the same number of rows in a plain table; steady roofline (once a round): pgbench, 16 clients, insert 100, claim 100, guarded complete of 100 in a loop from an empty table shaped like runlease's, until as many rows are done; {}",
        durability
    );
    println!(
        "WAL: over the drain / over enqueue + drain, of the run's database alone (pg_waldump) and of the whole server (pg_current_wal_lsn, other clients included); PG buffers: shared buffers the run's database's backends touched (blks_hit + blks_read), the same whatever the machine's speed; PG CPU: the run's database's backends / the whole server (postmaster and its children); bench CPU: this process (the workers)\n"
    );
    println!(
        "| system | workers | mode | drain jobs/s | × roofline | PG xacts/job | PG buffers/job | WAL B/job drain / enq+drain | server WAL B/job drain / enq+drain | PG CPU µs/job (backends) | PG CPU µs/job (server) | PG CPU µs/job enqueue | coordinator CPU µs/job | bench CPU µs/job | HTTP req/job | claim→complete p50/p99 ms | enqueue→start p50/p99 ms | rounds (jobs/s) |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    let all: Vec<String> = rooflines.iter().map(|r| format!("{:.0}", r.jobs_per_s)).collect();
    println!(
        "| PostgreSQL roofline (pgbench) | 16 clients | claim 100, complete 100 | {:.0} | 1.00 | {:.3} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} | {:.1} | – | – | – | – | – | – | {} |",
        med(&rooflines, |r| r.jobs_per_s),
        med(&rooflines, |r| r.xacts_per_job),
        med(&rooflines, |r| r.buffers_per_job),
        med(&rooflines, |r| r.db_wal_per_job.0),
        med(&rooflines, |r| r.db_wal_per_job.1),
        med(&rooflines, |r| r.wal_per_job.0),
        med(&rooflines, |r| r.wal_per_job.1),
        med(&rooflines, |r| r.pg_cpu.0),
        med(&rooflines, |r| r.pg_cpu.1),
        all.join(", ")
    );
    let all: Vec<String> = steady.iter().map(|r| format!("{:.0}", r.jobs_per_s)).collect();
    println!(
        "| PostgreSQL steady roofline (pgbench) | 16 clients | insert 100, claim 100, complete 100 | {:.0} | {:.2} | {:.3} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} | {:.1} | – | – | – | – | – | – | {} |",
        med(&steady, |r| r.jobs_per_s),
        med(&steady, |r| r.jobs_per_s) / med(&rooflines, |r| r.jobs_per_s),
        med(&steady, |r| r.xacts_per_job),
        med(&steady, |r| r.buffers_per_job),
        med(&steady, |r| r.db_wal_per_job.0),
        med(&steady, |r| r.db_wal_per_job.1),
        med(&steady, |r| r.wal_per_job.0),
        med(&steady, |r| r.wal_per_job.1),
        med(&steady, |r| r.pg_cpu.0),
        med(&steady, |r| r.pg_cpu.1),
        all.join(", ")
    );
    for ((b, w, k), v) in &runs {
        let mode = if v.iter().all(|(r, _)| r.mode == v[0].0.mode) {
            v[0].0.mode
        } else {
            "mixed"
        };
        let all: Vec<String> = v.iter().map(|(r, _)| format!("{:.0}", r.jobs_per_s)).collect();
        let row = format!(
            "| {} | {w} | {mode} | {:.0} | {:.2} | {:.3} | {:.1} | {:.0} / {:.0} | {:.0} / {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.3} | {:.1} / {:.1} | {:.0} / {:.0} | {} |",
            label(&systems[*b], *k),
            med(v, |(r, _)| r.jobs_per_s),
            med(v, |(_, x)| *x),
            med(v, |(r, _)| r.xacts),
            med(v, |(r, _)| r.buffers),
            med(v, |(r, _)| r.db_wal.0),
            med(v, |(r, _)| r.db_wal.1),
            med(v, |(r, _)| r.wal.0),
            med(v, |(r, _)| r.wal.1),
            med(v, |(r, _)| r.pg_cpu.0),
            med(v, |(r, _)| r.pg_cpu.1),
            med(v, |(r, _)| r.pg_enqueue_cpu),
            med(v, |(r, _)| r.coordinator_cpu),
            med(v, |(r, _)| r.bench_cpu),
            med(v, |(r, _)| r.requests),
            med(v, |(r, _)| r.claim_to_complete.0),
            med(v, |(r, _)| r.claim_to_complete.1),
            med(v, |(r, _)| r.enqueue_to_start.0),
            med(v, |(r, _)| r.enqueue_to_start.1),
            all.join(", ")
        );
        // graphile-worker has no HTTP requests nor rows to time.
        println!("{}", row.replace("NaN / NaN", "–").replace("NaN", "–"));
    }
    print_steady(systems, &runs, &steady);
    print_paired(systems, &runs);
    // The first system's median at the most workers, one process: what a
    // push drain is set beside.
    let most = workers.iter().copied().max().unwrap_or(0);
    Ok(runs
        .iter()
        .find(|((b, w, k), _)| *b == 0 && *w == most && *k == 1)
        .map(|(_, v)| med(v, |(r, _)| r.jobs_per_s)))
}

/// Each drain against the steady roofline of its round (the roofline
/// without a finite backlog's dead index entries to walk).
fn print_steady(systems: &[System], runs: &[(BuildWorkers, Vec<(Run, f64)>)], steady: &[Roofline]) {
    let steady: Vec<f64> = steady.iter().map(|r| r.jobs_per_s).collect();
    println!(
        "\nagainst the steady roofline (pgbench, 16 clients, insert 100, claim 100, guarded complete of 100 in a loop, a table shaped like runlease's), round by round (median, range)\n"
    );
    println!("| system | workers | drain jobs/s ÷ steady roofline |");
    println!("|---|---:|---:|");
    for ((b, w, k), v) in runs {
        let this: Vec<f64> = v.iter().map(|(r, _)| r.jobs_per_s).collect();
        let cell = paired(&steady, &this).map_or_else(
            || "–".to_owned(),
            |(m, lo, hi)| format!("{m:.2} ({lo:.2}–{hi:.2})"),
        );
        println!("| {} | {w} | {cell} |", label(&systems[*b], *k));
    }
}

/// Each build against the first one named, round by round: the drains of a
/// round at one worker count run back to back, tens of seconds apart, so
/// their ratio shares the machine's speed at the time (it drifts within a run),
/// which the ratio of two medians over the whole run does not.
fn print_paired(systems: &[System], runs: &[(BuildWorkers, Vec<(Run, f64)>)]) {
    if systems.len() < 2 {
        return;
    }
    let first = systems[0].name();
    println!(
        "\nagainst {first}, round by round (the median of each round's ratio, and its range over the rounds)\n"
    );
    println!(
        "| system | workers | drain jobs/s ÷ {first} | PG CPU µs/job (backends) ÷ {first} | PG buffers/job ÷ {first} | coordinator CPU µs/job ÷ {first} | WAL B/job drain ÷ {first} |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for ((b, w, k), v) in runs {
        if *b == 0 {
            continue;
        }
        let Some((_, base)) = runs.iter().find(|(key, _)| *key == (0, *w, *k)) else {
            continue;
        };
        let cell = |f: fn(&Run) -> f64| {
            let (this, first): (Vec<f64>, Vec<f64>) =
                v.iter().zip(base).map(|((r, _), (q, _))| (f(r), f(q))).unzip();
            paired(&first, &this).map_or_else(
                || "–".to_owned(),
                |(m, lo, hi)| format!("{m:.2} ({lo:.2}–{hi:.2})"),
            )
        };
        println!(
            "| {} | {w} | {} | {} | {} | {} | {} |",
            label(&systems[*b], *k),
            cell(|r| r.jobs_per_s),
            cell(|r| r.pg_cpu.0),
            cell(|r| r.buffers),
            cell(|r| r.coordinator_cpu),
            cell(|r| r.db_wal.0),
        );
    }
}

/// The ratios `other[i] / base[i]` of the rounds where both are figures:
/// their median, lowest and highest (`None` when no round has both).
pub(crate) fn paired(base: &[f64], other: &[f64]) -> Option<(f64, f64, f64)> {
    let mut ratios: Vec<f64> = base
        .iter()
        .zip(other)
        .filter(|(b, o)| b.is_finite() && o.is_finite() && **b > 0.0)
        .map(|(b, o)| o / b)
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let (lo, hi) = (ratios[0], ratios[ratios.len() - 1]);
    Some((median(ratios), lo, hi))
}

#[cfg(test)]
mod tests {
    use super::{Build, paired};

    #[test]
    fn ratios_are_taken_round_by_round() {
        // The base drifts; each round's ratio is 0.5 whatever the drift.
        let (m, lo, hi) = paired(&[40.0, 30.0, 20.0], &[20.0, 15.0, 10.0]).unwrap();
        assert_eq!((m, lo, hi), (0.5, 0.5, 0.5));
        // Rounds without a figure on either side (or a zero base) are left out.
        let (m, lo, hi) = paired(&[10.0, f64::NAN, 10.0, 10.0, 0.0], &[6.0, 5.0, 8.0, 7.0, 1.0]).unwrap();
        assert_eq!((m, lo, hi), (0.7, 0.6, 0.8));
        assert!(paired(&[f64::NAN], &[1.0]).is_none());
    }

    #[test]
    fn builds_are_named_or_called_by_their_path() {
        let b = Build::parse("old=/tmp/x/runlease-coordinator");
        assert_eq!(
            (b.name.as_str(), b.binary.to_str()),
            ("old", Some("/tmp/x/runlease-coordinator"))
        );
        let b = Build::parse("target/release/runlease-coordinator");
        assert_eq!(b.name, "target/release/runlease-coordinator");
        assert_eq!(b.binary.to_str(), Some("target/release/runlease-coordinator"));
    }
}
