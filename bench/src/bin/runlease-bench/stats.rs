//! Small measurement helpers.

use std::time::Duration;

use runlease_tests::admin;

/// The median of samples (the upper one of an even count; NaN of none).
pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The median of one column over runs.
pub fn med<T>(runs: &[T], f: impl Fn(&T) -> f64) -> f64 {
    median(runs.iter().map(f).collect())
}

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
    // Backends flush their counters at most once a second.
    xacts_settled(db, Duration::from_millis(1_200)).await
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

    /// The share of the machine's cores that were busy (anything but idle
    /// and I/O wait) since `earlier`, over `wall` of wall-clock time.
    pub fn busy_share_since(self, earlier: Cpu, wall: Duration) -> f64 {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let busy = self.busy.saturating_sub(earlier.busy) as f64 / TICKS_PER_SEC;
        busy / (wall.as_secs_f64() * cores).max(f64::MIN_POSITIVE)
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

/// utime + stime + cutime + cstime of process `pid`, in clock ticks (`None`
/// once it has gone). The children's times matter for the postmaster: a
/// backend that exits hands its CPU time to it when it is reaped.
pub fn process_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    // After the command name: state is field 3, utime field 14 … cstime 17.
    Some(
        after
            .split_whitespace()
            .skip(11)
            .take(4)
            .filter_map(|f| f.parse::<u64>().ok())
            .sum(),
    )
}

/// CPU µs of clock ticks.
pub fn ticks_us(ticks: u64) -> f64 {
    ticks as f64 / TICKS_PER_SEC * 1e6
}

/// Time process `pid` (its main thread: a PostgreSQL backend has no other)
/// has spent on a CPU, in nanoseconds, from `/proc/{pid}/schedstat` (`None`
/// once it has gone). Unlike the clock ticks of `/proc/{pid}/stat`, which
/// round to 10 ms, this counts every nanosecond: a drain of 20,000 jobs
/// costs its backends a few hundred milliseconds, which ticks summed over a
/// dozen backends would blur by several percent.
pub fn process_run_ns(pid: u32) -> Option<u64> {
    let schedstat = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).ok()?;
    schedstat.split_whitespace().next()?.parse().ok()
}

/// CPU µs of nanoseconds.
pub fn ns_us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// The process id of the PostgreSQL server the harness uses (the first
/// line of `postmaster.pid` in its data directory).
pub async fn postmaster_pid() -> u32 {
    let dir: String = admin()
        .await
        .query_one("SHOW data_directory", &[])
        .await
        .unwrap()
        .get(0);
    let pidfile = std::fs::read_to_string(format!("{dir}/postmaster.pid"))
        .unwrap_or_else(|e| panic!("cannot read {dir}/postmaster.pid: {e} (run on the database machine)"));
    pidfile
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a process id on the first line of postmaster.pid")
}

/// CPU time of the PostgreSQL server whose postmaster is `postmaster`: the
/// postmaster, its background processes and every backend, and through the
/// postmaster's children's times every backend that has exited, in clock
/// ticks. The whole server's work, its other clients' included (other
/// PostgreSQL servers on the machine are not counted).
pub fn server_ticks(postmaster: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let parent = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // After the command name: state, then the parent's process id.
        stat.rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse::<u32>()
            .ok()
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid == postmaster || parent(pid) == Some(postmaster))
        .filter_map(process_ticks)
        .sum()
}

/// The server's current WAL insert position, in bytes.
pub async fn wal_lsn(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint", &[])
        .await
        .unwrap()
        .get(0)
}

/// What `pg_stat_database` counts for one database.
#[derive(Debug, Clone, Copy)]
pub struct DbCounters {
    /// Transactions committed or rolled back.
    pub xacts: i64,
    /// Shared buffers its backends read or wrote (`blks_hit + blks_read`):
    /// every page a statement touches, found in memory or not. Unlike CPU
    /// time, it does not move with the machine's speed, so it shows a
    /// change in PostgreSQL's work that the CPU figures' noise can hide.
    pub buffers: i64,
}

/// The counters of database `db`, read once every backend's counters are
/// in: after `settle` (a backend that went idle publishes within about ten
/// seconds; one that exits, at once).
pub async fn counters_settled(db: &str, settle: Duration) -> DbCounters {
    tokio::time::sleep(settle).await;
    let admin = admin().await;
    admin
        .batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let row = admin
        .query_one(
            "SELECT (xact_commit + xact_rollback)::bigint, (blks_hit + blks_read)::bigint \
             FROM pg_stat_database WHERE datname = $1",
            &[&db],
        )
        .await
        .unwrap();
    DbCounters {
        xacts: row.get(0),
        buffers: row.get(1),
    }
}

/// Transactions committed or rolled back in database `db`, read as
/// [`counters_settled`] does.
pub async fn xacts_settled(db: &str, settle: Duration) -> i64 {
    counters_settled(db, settle).await.xacts
}

/// Waits until no backend serves database `db` (its clients have gone and
/// their counters are published).
pub async fn backends_gone(db: &str) {
    let admin = admin().await;
    for _ in 0..500 {
        let n: i64 = admin
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", &[&db])
            .await
            .unwrap()
            .get(0);
        if n == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("backends of {db} still there 10 s after their clients left");
}

/// Process ids of the backends serving database `db`.
async fn backend_pids(admin: &tokio_postgres::Client, db: &str) -> Vec<u32> {
    admin
        .query("SELECT pid FROM pg_stat_activity WHERE datname = $1", &[&db])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get::<_, i32>(0).unsigned_abs())
        .collect()
}

/// CPU time of the backends serving one database (autovacuum workers
/// included), in nanoseconds ([`process_run_ns`]), sampled every 10 ms
/// while it runs: a backend that exits keeps its last sample. Backends seen
/// at the start count from there; later ones from zero.
pub struct BackendCpu {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<u64>,
}

impl BackendCpu {
    /// Starts sampling the backends of `db`.
    pub async fn start(db: &str) -> Self {
        let admin = admin().await;
        let db = db.to_owned();
        let mut seen: std::collections::HashMap<u32, (u64, u64)> = backend_pids(&admin, &db)
            .await
            .into_iter()
            .filter_map(|pid| process_run_ns(pid).map(|t| (pid, (t, t))))
            .collect();
        let stop = tokio_util::sync::CancellationToken::new();
        let cancelled = stop.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            let mut n = 0u64;
            loop {
                let done = tokio::select! {
                    _ = tick.tick() => false,
                    () = cancelled.cancelled() => true,
                };
                if n.is_multiple_of(10) || done {
                    for pid in backend_pids(&admin, &db).await {
                        seen.entry(pid).or_insert((0, 0));
                    }
                }
                n += 1;
                for (pid, (_, last)) in seen.iter_mut() {
                    if let Some(t) = process_run_ns(*pid) {
                        *last = t;
                    }
                }
                if done {
                    return seen
                        .values()
                        .map(|(first, last)| last.saturating_sub(*first))
                        .sum();
                }
            }
        });
        BackendCpu { stop, task }
    }

    /// Takes a last sample and answers the nanoseconds spent since the start.
    pub async fn stop(self) -> u64 {
        self.stop.cancel();
        self.task.await.unwrap()
    }
}

/// Where Debian's PostgreSQL 15 puts pg_waldump.
const PG_WALDUMP: &str = "/usr/lib/postgresql/15/bin/pg_waldump";

/// `pg_lsn` text of a WAL position in bytes.
fn lsn_text(lsn: i64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// What one line of pg_waldump says, as far as [`database_wal`] cares.
#[derive(Debug, PartialEq, Eq)]
enum WalRecord {
    /// A commit or abort record (of any database: the caller keeps those of
    /// transactions that wrote to its own).
    End { xid: u64, bytes: u64 },
    /// A record touching a relation of the database.
    Mine { xid: u64, bytes: u64 },
}

/// Reads a pg_waldump line, e.g. `rmgr: Heap len (rec/tot): 54/ 54, tx:
/// 735, lsn: 0/01A2B3C8, prev 0/01A2B390, desc: HOT_UPDATE …, blkref #0:
/// rel 1663/16384/16385 blk 0`; `oid_slash` is the database's oid and a
/// slash. Lines of other databases, and records of none, are `None`.
fn wal_record(line: &str, oid_slash: &str) -> Option<WalRecord> {
    let (_, rest) = line.split_once("(rec/tot):")?;
    let bytes = rest
        .split_once('/')
        .and_then(|(_, t)| t.split(',').next())
        .and_then(|t| t.trim().parse::<u64>().ok())?;
    let xid = rest
        .split_once("tx:")
        .and_then(|(_, t)| t.split(',').next())
        .and_then(|t| t.trim().parse::<u64>().ok())?;
    if line.starts_with("rmgr: Transaction") {
        return Some(WalRecord::End { xid, bytes });
    }
    let mine = line.split(" rel ").skip(1).any(|r| {
        r.split_once('/')
            .is_some_and(|(_, after)| after.starts_with(oid_slash))
    });
    mine.then_some(WalRecord::Mine { xid, bytes })
}

/// WAL bytes the server wrote for database `db` between `start` and `end`
/// (positions in bytes), read back with pg_waldump: every record that
/// touches one of its relations, and the commit and abort records of the
/// transactions that wrote them. Other clients of the server do not count,
/// nor does what belongs to no database (checkpoints, running-transaction
/// snapshots). `None` if the WAL is no longer there or cannot be read.
pub async fn database_wal(db: &str, start: i64, end: i64) -> Option<u64> {
    use tokio::io::AsyncBufReadExt;
    let admin = admin().await;
    let oid: u32 = admin
        .query_one("SELECT oid FROM pg_database WHERE datname = $1", &[&db])
        .await
        .ok()?
        .get(0);
    let dir: String = admin.query_one("SHOW data_directory", &[]).await.ok()?.get(0);
    // pg_waldump reads the files: wait until the WAL up to `end` is on disk
    // (the WAL writer flushes what commits did not within a fraction of a second).
    for _ in 0..100 {
        let flushed: i64 = admin
            .query_one("SELECT (pg_current_wal_flush_lsn() - '0/0'::pg_lsn)::bigint", &[])
            .await
            .ok()?
            .get(0);
        if flushed >= end {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut child = tokio::process::Command::new(PG_WALDUMP)
        .args([
            "-p",
            &format!("{dir}/pg_wal"),
            "-s",
            &lsn_text(start),
            "-e",
            &lsn_text(end),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take()?).lines();
    let mine = format!("/{oid}/");
    let mut bytes = 0u64;
    let mut writers = std::collections::HashSet::new();
    let mut ends: Vec<(u64, u64)> = Vec::new();
    while let Ok(Some(line)) = lines.next_line().await {
        match wal_record(&line, &mine[1..]) {
            Some(WalRecord::End { xid, bytes }) => ends.push((xid, bytes)),
            Some(WalRecord::Mine { xid, bytes: b }) => {
                bytes += b;
                if xid != 0 {
                    writers.insert(xid);
                }
            }
            None => {}
        }
    }
    let status = child.wait().await.ok()?;
    if !status.success() {
        return None;
    }
    Some(
        bytes
            + ends
                .iter()
                .filter(|(x, _)| writers.contains(x))
                .map(|(_, t)| t)
                .sum::<u64>(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_middle_sample() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        // Of an even count, the upper of the two middle samples.
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 3.0);
        assert!(median(Vec::new()).is_nan());
    }

    #[test]
    fn run_time_counts_a_thread_s_work_in_nanoseconds() {
        // This thread's own id (the test runs on a thread of its own; a
        // backend's process id is its one thread's id): `/proc/TID` reads
        // that thread alone.
        let me: u32 = std::fs::read_link("/proc/thread-self")
            .expect("/proc/thread-self")
            .file_name()
            .and_then(|t| t.to_str()?.parse().ok())
            .expect("a thread id");
        let before = process_run_ns(me).expect("this thread's schedstat");
        // Spin until the clock has moved 20 ms: the time this thread spent
        // on a CPU must then have grown, by at least a millisecond (other
        // tests share the cores, so not by all of it) and by no more than
        // the wall time plus slack (the second field, time spent waiting to
        // run, would not pass both).
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let wall = started.elapsed().as_nanos() as u64;
        let spent = process_run_ns(me).expect("still running") - before;
        assert!(
            (1_000_000..=wall + 5_000_000).contains(&spent),
            "spent {spent} ns over {wall} ns"
        );
        assert_eq!(process_run_ns(u32::MAX), None);
    }

    #[test]
    fn lsn_text_is_pg_lsn_notation() {
        assert_eq!(lsn_text(0x1_6394_F958), "1/6394F958");
        assert_eq!(lsn_text(0x10), "0/10");
    }

    #[test]
    fn wal_records_of_the_database_its_commits_and_nothing_else() {
        let mine = "rmgr: Btree       len (rec/tot):     98/    98, tx:          0, lsn: 0/638000C0, prev 0/63800070, desc: UNLINK_PAGE left 2367, blkref #0: rel 1663/17061/17120 blk 2310, blkref #1: rel 1663/17061/17120 blk 2367";
        assert_eq!(
            wal_record(mine, "17061/"),
            Some(WalRecord::Mine { xid: 0, bytes: 98 })
        );
        // Another database whose oid starts with the same digits.
        assert_eq!(wal_record(mine, "1706/"), None);
        let heap = "rmgr: Heap        len (rec/tot):     54/  8242, tx:        735, lsn: 0/01A2B3C8, prev 0/01A2B390, desc: HOT_UPDATE off 3, blkref #0: rel 1663/16384/16385 blk 0 FPW";
        assert_eq!(
            wal_record(heap, "16384/"),
            Some(WalRecord::Mine {
                xid: 735,
                bytes: 8242
            })
        );
        let commit = "rmgr: Transaction len (rec/tot):     34/    34, tx:      10099, lsn: 0/63951088, prev 0/63951060, desc: COMMIT 2026-12-01 12:54:19.354694 UTC";
        assert_eq!(
            wal_record(commit, "16384/"),
            Some(WalRecord::End {
                xid: 10099,
                bytes: 34
            })
        );
        let snapshot = "rmgr: Standby     len (rec/tot):     50/    50, tx:          0, lsn: 0/63951128, prev 0/639510F0, desc: RUNNING_XACTS nextXid 10100";
        assert_eq!(wal_record(snapshot, "16384/"), None);
        assert_eq!(
            wal_record("pg_waldump: error: could not find a valid record", "1/"),
            None
        );
    }
}
