//! Small measurement helpers.

use std::time::Duration;

use runlease_tests::admin;

/// The `p` quantile of sorted samples.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

/// Transactions committed or rolled back in database `db` so far.
pub async fn xacts(db: &str) -> i64 {
    let admin = admin().await;
    // Backends flush their counters at most once a second.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    admin
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    admin
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = $1",
            &[&db],
        )
        .await
        .unwrap()
        .get(0)
}

/// Claim→complete and enqueue→start latencies (ms, p50 and p99) from the
/// attempt chronology of completed jobs (PostgreSQL's clock).
pub async fn latencies(client: &tokio_postgres::Client) -> ((f64, f64), (f64, f64)) {
    let rows = client
        .query(
            "SELECT (extract(epoch FROM a.finished_at - a.claimed_at) * 1000)::float8,
                    (extract(epoch FROM a.claimed_at - j.created_at) * 1000)::float8
             FROM job_attempts a JOIN jobs j ON j.id = a.job_id
             WHERE a.outcome = 'completed'",
            &[],
        )
        .await
        .unwrap();
    let mut c2c: Vec<f64> = rows.iter().map(|r| r.get::<_, f64>(0)).collect();
    let mut e2s: Vec<f64> = rows.iter().map(|r| r.get::<_, f64>(1)).collect();
    c2c.sort_by(f64::total_cmp);
    e2s.sort_by(f64::total_cmp);
    (
        (percentile(&c2c, 0.5), percentile(&c2c, 0.99)),
        (percentile(&e2s, 0.5), percentile(&e2s, 0.99)),
    )
}

/// CPU time so far, in clock ticks: this process's, and the whole machine's
/// busy time (everything but idle and I/O wait).
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    own: u64,
    busy: u64,
}

/// Clock ticks per second of `/proc` figures (`getconf CLK_TCK`; 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

impl Cpu {
    /// Reads `/proc/self/stat` and `/proc/stat`.
    pub fn now() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which may hold spaces): utime is the
        // 14th field of the line, stime the 15th.
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<u64> = after
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|f| f.parse().ok())
            .collect();
        let own = fields.iter().sum();
        let all = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let ticks: Vec<u64> = all
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|f| f.parse().ok())
            .collect();
        let total: u64 = ticks.iter().take(8).sum();
        let idle = ticks.get(3).copied().unwrap_or(0) + ticks.get(4).copied().unwrap_or(0);
        Cpu {
            own,
            busy: total.saturating_sub(idle),
        }
    }

    /// CPU µs per job since `earlier`: (this process, everything else —
    /// PostgreSQL, essentially).
    pub fn per_job_since(self, earlier: Cpu, jobs: usize) -> (f64, f64) {
        let us = |ticks: u64| ticks as f64 / TICKS_PER_SEC * 1e6 / jobs as f64;
        let own = self.own.saturating_sub(earlier.own);
        let busy = self.busy.saturating_sub(earlier.busy);
        (us(own), us(busy.saturating_sub(own)))
    }
}
