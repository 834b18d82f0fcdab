//! The verification: every job, from the database (`jobs`, `job_attempts`)
//! and from the workers' own logs of the answers they got.
//!
//! - **Lost**: a job number the producer had acknowledged with no row, or a
//!   row that is not terminal.
//! - **Stale accepted**: a done job whose result was not computed under its
//!   final run lease (the handler stamps the lease into the result), whose
//!   digest is wrong, or whose `completed` attempt is not its final lease; a
//!   `complete` acknowledged (200) under a lease that is not the job's final
//!   one, or with another result than the one in the row; a `fail` or
//!   `release` acknowledged under a lease whose attempt row says otherwise.
//! - **Run more than once**: claimed more than once (allowed, counted), and
//!   finished (answered 200) by more than one lease.
//! - **SLO**: the share of jobs terminal within 25 s of their enqueue.
//! - **Chronology**: a terminal job has one attempt row per run lease
//!   (1..=run_lease), each claimed before it finished and after the previous
//!   one finished, all but the last leaving the job queued, the last leaving
//!   it in its final state.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use crate::jobs;

/// What the run should have produced.
pub struct Expect {
    /// Jobs enqueued (numbers 0..jobs).
    pub jobs: u64,
    /// One job in this many stalls on its first lease.
    pub stall_every: u64,
    /// The latency objective.
    pub slo: Duration,
    /// How long enqueueing took.
    pub enqueue_took: Duration,
    /// The whole soak so far.
    pub elapsed: Duration,
}

/// One line of a worker's log.
struct Ack {
    job: Uuid,
    run_lease: i64,
    n: u64,
    action: String,
    status: String,
    result: Option<Value>,
    worker: String,
}

/// What the workers' logs hold: finishing answers, 5xx answers other than
/// 503 (path and status), and lines a SIGKILL tore.
pub struct Logs {
    acks: Vec<Ack>,
    server_errors: Vec<String>,
    torn: usize,
}

/// Every worker log in `logs`, read now.
pub fn read_logs(logs: &[PathBuf]) -> Logs {
    let mut acks = Vec::new();
    let mut server_errors = Vec::new();
    let mut torn = 0;
    for path in logs {
        let Ok(file) = std::fs::File::open(path) else {
            continue;
        };
        for line in std::io::BufReader::new(file).lines() {
            let Ok(line) = line else {
                torn += 1;
                continue;
            };
            let value = serde_json::from_str::<Value>(&line).ok();
            if let Some(v) = &value
                && v["event"] == "server_error"
            {
                server_errors.push(format!("{} answered {}: {}", v["path"], v["http"], v["answer"]));
                continue;
            }
            let parsed = value.and_then(|v| {
                Some(Ack {
                    job: v["job_id"].as_str()?.parse().ok()?,
                    run_lease: v["run_lease"].as_i64()?,
                    n: v["n"].as_u64()?,
                    action: v["action"].as_str()?.to_owned(),
                    status: v["status"].as_str()?.to_owned(),
                    result: v.get("result").cloned(),
                    worker: v["worker"].as_str()?.to_owned(),
                })
            });
            match parsed {
                Some(a) => acks.push(a),
                // Only the line a SIGKILL interrupted can be torn.
                None => torn += 1,
            }
        }
    }
    Logs {
        acks,
        server_errors,
        torn,
    }
}

impl Logs {
    /// How many stalled first leases have logged their (late) finish.
    pub fn stalled_finishes(&self, stall_every: u64) -> usize {
        self.acks
            .iter()
            .filter(|a| a.run_lease == 1 && jobs::Kind::of(a.n, stall_every) == jobs::Kind::Stall)
            .count()
    }

    /// How many of `leases` (job id, run lease) have logged a finish.
    pub fn answered(&self, leases: &[(Uuid, i64)]) -> usize {
        self.count_of(leases, |_| true)
    }

    /// How many of `leases` (job id, run lease) have logged a refused finish.
    pub fn refused(&self, leases: &[(Uuid, i64)]) -> usize {
        self.count_of(leases, |a| a.status == "refused")
    }

    fn count_of(&self, leases: &[(Uuid, i64)], counts: impl Fn(&Ack) -> bool) -> usize {
        leases
            .iter()
            .filter(|(job, run_lease)| {
                self.acks
                    .iter()
                    .any(|a| a.job == *job && a.run_lease == *run_lease && counts(a))
            })
            .count()
    }
}

struct JobRow {
    n: u64,
    state: String,
    run_lease: i64,
    result: Option<Value>,
    took_ms: Option<f64>,
}

struct AttemptRow {
    run_lease: i64,
    outcome: String,
    state_after: String,
    claimed_ms: f64,
    finished_ms: f64,
}

/// The findings.
#[derive(Default)]
pub struct Report {
    rows: usize,
    done: usize,
    failed_or_cancelled: usize,
    missing: usize,
    duplicated: usize,
    not_terminal: usize,
    stale_results: usize,
    wrong_digest: usize,
    completed_rows_wrong: usize,
    stale_acks: usize,
    acks_not_recorded: usize,
    refused_but_landed: usize,
    acks: usize,
    refused: usize,
    refused_stalls: usize,
    unknown: usize,
    unexpected: usize,
    torn_lines: usize,
    server_errors: usize,
    /// Stale finishes refused, per worker id.
    pub refused_by_worker: HashMap<String, usize>,
    claimed_more_than_once: usize,
    finished_by_two_leases: usize,
    lease_expiries: i64,
    attempts: usize,
    chronology: usize,
    examples: Vec<String>,
    within_slo: usize,
    latencies: Vec<f64>,
    slo_share_ok: bool,
}

impl Report {
    fn example(&mut self, what: String) {
        if self.examples.len() < 20 {
            self.examples.push(what);
        }
    }

    /// Jobs lost: missing or not terminal.
    pub fn lost(&self) -> usize {
        self.missing + self.not_terminal
    }

    /// Stale or wrong outcomes the system accepted.
    pub fn stale_accepted(&self) -> usize {
        self.stale_results + self.wrong_digest + self.completed_rows_wrong + self.stale_acks
    }

    fn slo_share(&self, expect: &Expect) -> f64 {
        self.within_slo as f64 / expect.jobs.max(1) as f64
    }

    /// Every target met.
    pub fn passed(&self) -> bool {
        self.lost() == 0
            && self.stale_accepted() == 0
            && self.duplicated == 0
            && self.failed_or_cancelled == 0
            && self.acks_not_recorded == 0
            && self.refused_but_landed == 0
            && self.unexpected == 0
            && self.server_errors == 0
            && self.chronology == 0
            && self.refused > 0
            && self.slo_share_ok
    }

    /// Prints the report.
    pub fn print(&self, expect: &Expect) {
        let pct = |x: f64| x * 100.0;
        let p = |q: f64| crate::verify::percentile(&self.latencies, q) / 1000.0;
        println!();
        println!(
            "runlease-chaos report: {} jobs enqueued in {:.1} s, soak {:.1} s",
            expect.jobs,
            expect.enqueue_took.as_secs_f64(),
            expect.elapsed.as_secs_f64()
        );
        println!(
            "  jobs lost                 {:>8}  (missing {}, not terminal {})   target 0",
            self.lost(),
            self.missing,
            self.not_terminal
        );
        println!(
            "  stale outcomes accepted   {:>8}  (result under an old lease {}, wrong digest {}, completed attempt not the final lease {}, 200 for a lease not the final one {})   target 0",
            self.stale_accepted(),
            self.stale_results,
            self.wrong_digest,
            self.completed_rows_wrong,
            self.stale_acks
        );
        println!(
            "  terminal within {:>2} s      {:>7.2}%  (p50 {:.2} s, p99 {:.2} s, max {:.2} s)   target >= 95%",
            expect.slo.as_secs(),
            pct(self.slo_share(expect)),
            p(0.5),
            p(0.99),
            p(1.0)
        );
        println!(
            "  done {}, failed or cancelled {}, rows {} (duplicated numbers {})",
            self.done, self.failed_or_cancelled, self.rows, self.duplicated
        );
        println!(
            "  run more than once        {:>8}  jobs claimed more than once (allowed); {} completed with 200 by two leases",
            self.claimed_more_than_once, self.finished_by_two_leases
        );
        println!(
            "  worker answers: {} ok, {} refused as lease_lost (stale finishes; {} of them stalled handlers), {} unknown (gave up retrying), {} unexpected 4xx, {} 5xx other than 503, {} torn log lines",
            self.acks,
            self.refused,
            self.refused_stalls,
            self.unknown,
            self.unexpected,
            self.server_errors,
            self.torn_lines
        );
        println!(
            "  acknowledged but not in the record {}, refused but landed {}",
            self.acks_not_recorded, self.refused_but_landed
        );
        println!(
            "  attempts {} ({} lease expiries); chronology violations {}",
            self.attempts, self.lease_expiries, self.chronology
        );
        if !self.examples.is_empty() {
            println!("  first findings:");
            for e in &self.examples {
                println!("    {e}");
            }
        }
    }
}

/// `q` quantile of `sorted` (0 when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Checks every job; `client` reaches the soak's database directly.
pub async fn check(
    client: &tokio_postgres::Client,
    logs: &[PathBuf],
    expect: &Expect,
) -> anyhow::Result<Report> {
    let mut r = Report::default();
    let rows = client
        .query(
            "SELECT id, (payload->>'n')::bigint, state::text, run_lease, result,
                    (extract(epoch FROM finished_at - created_at) * 1000)::float8
             FROM jobs WHERE queue = ANY($1)",
            &[&&jobs::QUEUES[..]],
        )
        .await?;
    let mut by_id: HashMap<Uuid, JobRow> = HashMap::with_capacity(rows.len());
    let mut seen = vec![false; expect.jobs as usize];
    for row in rows {
        let n: i64 = row.get(1);
        let job = JobRow {
            n: n as u64,
            state: row.get(2),
            run_lease: row.get(3),
            result: row.get(4),
            took_ms: row.get(5),
        };
        match seen.get_mut(job.n as usize) {
            Some(s) if *s => r.duplicated += 1,
            Some(s) => *s = true,
            None => r.duplicated += 1,
        }
        by_id.insert(row.get(0), job);
    }
    r.rows = by_id.len();
    r.missing = seen.iter().filter(|s| !**s).count();

    let attempts = client
        .query(
            "SELECT a.job_id, a.run_lease, a.outcome::text, a.state_after::text,
                    (extract(epoch FROM a.claimed_at) * 1000)::float8,
                    (extract(epoch FROM a.finished_at) * 1000)::float8
             FROM job_attempts a JOIN jobs j ON j.id = a.job_id
             WHERE j.queue = ANY($1) ORDER BY a.job_id, a.run_lease",
            &[&&jobs::QUEUES[..]],
        )
        .await?;
    r.attempts = attempts.len();
    let mut chronology: HashMap<Uuid, Vec<AttemptRow>> = HashMap::with_capacity(by_id.len());
    for row in attempts {
        let a = AttemptRow {
            run_lease: row.get(1),
            outcome: row.get(2),
            state_after: row.get(3),
            claimed_ms: row.get(4),
            finished_ms: row.get(5),
        };
        if a.outcome == "lease_expired" {
            r.lease_expiries += 1;
        }
        chronology.entry(row.get(0)).or_default().push(a);
    }

    for (id, job) in &by_id {
        let terminal = matches!(job.state.as_str(), "done" | "failed" | "cancelled");
        if !terminal {
            r.not_terminal += 1;
            r.example(format!("job {id} (n {}) is {} after the drain", job.n, job.state));
            continue;
        }
        if job.run_lease > 1 {
            r.claimed_more_than_once += 1;
        }
        if let Some(ms) = job.took_ms {
            r.latencies.push(ms);
            if ms <= expect.slo.as_millis() as f64 {
                r.within_slo += 1;
            }
        }
        if job.state == "done" {
            r.done += 1;
            let result = job.result.clone().unwrap_or(Value::Null);
            if result["run_lease"].as_i64() != Some(job.run_lease) {
                r.stale_results += 1;
                r.example(format!(
                    "job {id} is done under run_lease {} with a result computed under {}",
                    job.run_lease, result["run_lease"]
                ));
            }
            if result["n"].as_u64() != Some(job.n)
                || result["digest"].as_str() != Some(jobs::digest(job.n).as_str())
            {
                r.wrong_digest += 1;
                r.example(format!("job {id} (n {}) has a wrong result {result}", job.n));
            }
        } else {
            r.failed_or_cancelled += 1;
            r.example(format!("job {id} (n {}) ended {}", job.n, job.state));
        }
        let rows = chronology.get(id).map(Vec::as_slice).unwrap_or(&[]);
        let completed: Vec<i64> = rows
            .iter()
            .filter(|a| a.outcome == "completed")
            .map(|a| a.run_lease)
            .collect();
        if job.state == "done" && completed != [job.run_lease] {
            r.completed_rows_wrong += 1;
            r.example(format!(
                "job {id} is done under run_lease {} but its completed attempts are {completed:?}",
                job.run_lease
            ));
        }
        let leases: Vec<i64> = rows.iter().map(|a| a.run_lease).collect();
        let expected: Vec<i64> = (1..=job.run_lease).collect();
        let mut bad = leases != expected;
        for (i, a) in rows.iter().enumerate() {
            let last = i + 1 == rows.len();
            bad |= a.claimed_ms > a.finished_ms;
            bad |= i > 0 && a.claimed_ms < rows[i - 1].finished_ms;
            bad |= if last {
                a.state_after != job.state
            } else {
                a.state_after != "queued"
            };
        }
        if bad {
            r.chronology += 1;
            r.example(format!(
                "job {id} ({}, run_lease {}) has an inconsistent attempt chronology: {:?}",
                job.state,
                job.run_lease,
                rows.iter()
                    .map(|a| format!("{}:{}->{}", a.run_lease, a.outcome, a.state_after))
                    .collect::<Vec<_>>()
            ));
        }
    }

    let Logs {
        acks,
        server_errors,
        torn,
    } = read_logs(logs);
    r.torn_lines = torn;
    r.server_errors = server_errors.len();
    for e in server_errors {
        r.example(format!("a worker got a server error: {e}"));
    }
    let mut finished_by: HashMap<Uuid, Vec<i64>> = HashMap::new();
    for a in &acks {
        let Some(job) = by_id.get(&a.job) else {
            r.acks_not_recorded += 1;
            r.example(format!("an answer for job {} that has no row", a.job));
            continue;
        };
        let attempt = chronology
            .get(&a.job)
            .and_then(|rows| rows.iter().find(|x| x.run_lease == a.run_lease));
        let recorded = attempt.map(|x| x.outcome.as_str());
        let landed_as = match a.action.as_str() {
            "complete" => "completed",
            "fail" => "failed",
            _ => "released",
        };
        match a.status.as_str() {
            "ok" => {
                r.acks += 1;
                if a.action == "complete" {
                    finished_by.entry(a.job).or_default().push(a.run_lease);
                    if job.state != "done" || job.run_lease != a.run_lease || a.result != job.result {
                        r.stale_acks += 1;
                        r.example(format!(
                            "complete of job {} under run_lease {} answered 200, but the job is {} under run_lease {}",
                            a.job, a.run_lease, job.state, job.run_lease
                        ));
                    }
                } else if recorded != Some(landed_as) {
                    r.acks_not_recorded += 1;
                    r.example(format!(
                        "{} of job {} under run_lease {} answered 200, but that attempt is recorded as {recorded:?}",
                        a.action, a.job, a.run_lease
                    ));
                }
            }
            "refused" => {
                r.refused += 1;
                *r.refused_by_worker.entry(a.worker.clone()).or_default() += 1;
                if a.run_lease == 1 && jobs::Kind::of(a.n, expect.stall_every) == jobs::Kind::Stall {
                    r.refused_stalls += 1;
                }
                if recorded == Some(landed_as) {
                    r.refused_but_landed += 1;
                    r.example(format!(
                        "{} of job {} under run_lease {} was refused, yet it is recorded as landed",
                        a.action, a.job, a.run_lease
                    ));
                }
            }
            "unknown" => r.unknown += 1,
            _ => {
                r.unexpected += 1;
                r.example(format!(
                    "{} of job {} under run_lease {} got an unexpected answer",
                    a.action, a.job, a.run_lease
                ));
            }
        }
    }
    for leases in finished_by.values_mut() {
        leases.sort_unstable();
        leases.dedup();
        if leases.len() > 1 {
            r.finished_by_two_leases += 1;
        }
    }
    r.latencies.sort_by(f64::total_cmp);
    r.slo_share_ok = r.slo_share(expect) >= 0.95;
    Ok(r)
}
