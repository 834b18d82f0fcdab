//! Claim floors: where each queue's claim scan starts.
//!
//! A claim walks `jobs_claim_idx` in (priority, run_at, id) order from the
//! queue's first entry. Entries of jobs claimed since vacuum last ran stay
//! in the index until vacuum may remove them, and an old snapshot anywhere
//! on the cluster (a long report, a stuck session, a replica's feedback)
//! puts that off for as long as it lives: every claim then walks every job
//! claimed since, and claims get dearer by the minute. A floor is a key no
//! claimable job of its queue sorts below; the claim's scan starts there.
//!
//! How a floor stays below every claimable job:
//! - It is raised only to what the database answers: after its claims, a
//!   claim's transaction reads the first claimable job at or above the
//!   floor it used (`lease_claim_floor.sql`, no `SKIP LOCKED`, so a job a
//!   concurrent claim holds still counts), and the floor moves there once
//!   that transaction has committed. It never moves past a time a second
//!   before that read ([`MARGIN`]): a job written by a transaction that
//!   began before then and commits after is not passed by.
//! - Every write that makes a job claimable is followed, after its commit,
//!   by the queue's wake-up, here or (through Redis) on every other
//!   coordinator, and every wake-up passes here ([`ClaimFloors::wrote`]): a
//!   wake-up with the key of what was written (an enqueue, a release or a
//!   retry from a worker's finish) lowers the floor to it when it sorts
//!   below; any other wake-up drops the queue's floor. The claim riding a
//!   finish starts below what its items queued again (the store passes
//!   their keys), or at each queue's first entry after dependents or
//!   dead-letter follow-ups.
//!   A read that was under way while a wake-up passed takes it into account
//!   (the wake-ups since its start are counted and the recent keys kept).
//! - While this coordinator may not hear the others (Redis configured but
//!   its subscription down) there are no floors.
//! - A full scan now and then (the floor check) lowers a floor that a job
//!   written without any wake-up reaching here sorts below, and the
//!   coordinator counts it (`runlease_claim_floor_misses_total`).
//!
//! Without a pinned horizon vacuum keeps the walk short and floors change
//! nothing measurable; under one, a claim walks what was claimed since its
//! queue's last read instead of since the snapshot began.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::store::rows::col;
use crate::store::{Store, StoreError, sql};

/// How far behind its read a floor's due time stays.
pub const MARGIN: Duration = Duration::from_secs(1);

/// Keyed wake-ups kept per queue for reads under way.
const RECENT_WRITES: usize = 32;

/// Queues with a floor at most; beyond, a queue's claims start at its first
/// entry (queues are named by clients, so the map must not grow without
/// bound).
const MAX_QUEUES: usize = 4096;

/// A queue whose claims have not asked for its floor for this long may make
/// room for another.
const IDLE: Duration = Duration::from_secs(60);

/// A job's place in its queue's claim order: `jobs_claim_idx`'s key after
/// the queue. Ordered as PostgreSQL orders the index (a uuid compares as
/// its bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimKey {
    /// Smaller runs first.
    pub priority: i32,
    /// When the job is due.
    pub run_at: DateTime<Utc>,
    /// The job's id.
    pub id: Uuid,
}

/// One queue's floor and the wake-ups reads under way must account for.
#[derive(Debug)]
struct QueueFloor {
    floor: Option<ClaimKey>,
    /// [`Floors::seq`] when this entry was made: reads that started before
    /// cannot know which wake-ups they missed.
    since: u64,
    /// [`Floors::seq`] of the last wake-up without a key.
    unkeyed: u64,
    /// The last keyed wake-ups, with their [`Floors::seq`].
    recent: VecDeque<(u64, ClaimKey)>,
    /// [`Floors::seq`] of the last keyed wake-up no longer in `recent`.
    dropped: u64,
    /// When a claim last asked for this floor.
    used: Instant,
}

#[derive(Debug, Default)]
struct Floors {
    queues: HashMap<String, QueueFloor>,
    /// Wake-ups seen, every queue together.
    seq: u64,
}

/// A queue's floor as a claim took it: where its scan starts, and what the
/// read after it needs to move the floor.
#[derive(Debug, Clone)]
pub struct Taken {
    /// The queue.
    pub queue: String,
    /// Where the claim's scan starts (`None`: the queue's first entry).
    pub floor: Option<ClaimKey>,
    /// [`Floors::seq`] when taken; `None`: no read after the claim.
    seq: Option<u64>,
}

/// What `lease_claim_floor.sql` answered for one queue.
#[derive(Debug, Clone)]
pub struct Found {
    /// The queue.
    pub queue: String,
    /// The first claimable job at or above the start, if any.
    pub first: Option<ClaimKey>,
    /// The read's time.
    pub at: DateTime<Utc>,
}

/// The claim floors of one coordinator, shared by its claims and its
/// wake-ups.
#[derive(Debug)]
pub struct ClaimFloors {
    floors: Mutex<Floors>,
    /// Whether every other coordinator's wake-ups reach this one.
    hearing: AtomicBool,
}

impl Default for ClaimFloors {
    fn default() -> Self {
        Self::new()
    }
}

impl ClaimFloors {
    /// No floors yet; hearing every wake-up (one coordinator, or Redis up).
    pub fn new() -> Self {
        Self {
            floors: Mutex::new(Floors::default()),
            hearing: AtomicBool::new(true),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Floors> {
        self.floors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether wake-ups from every coordinator reach this one. While they
    /// do not, claims start at each queue's first entry.
    pub fn hearing(&self, yes: bool) {
        self.hearing.store(yes, Ordering::Relaxed);
        if !yes {
            self.forget_all();
        }
    }

    /// The floors of `queues` for a claim, in order.
    pub fn take(&self, queues: &[&str]) -> Vec<Taken> {
        if !self.hearing.load(Ordering::Relaxed) {
            return queues.iter().map(|q| Taken::bare(q)).collect();
        }
        let now = Instant::now();
        let mut f = self.lock();
        let seq = f.seq;
        queues
            .iter()
            .map(|&queue| {
                if !f.queues.contains_key(queue) && !f.make_room(now) {
                    return Taken::bare(queue);
                }
                let entry = f.queues.entry(queue.to_owned()).or_insert_with(|| QueueFloor {
                    floor: None,
                    since: seq,
                    unkeyed: 0,
                    recent: VecDeque::new(),
                    dropped: 0,
                    used: now,
                });
                entry.used = now;
                Taken {
                    queue: queue.to_owned(),
                    floor: entry.floor,
                    seq: Some(seq),
                }
            })
            .collect()
    }

    /// What the read after a claim found, once its transaction committed:
    /// each queue's floor moves to the first claimable job found (no later
    /// than [`MARGIN`] before the read), or below it to a key a wake-up
    /// since carried; a read that missed a wake-up without a key is
    /// dropped.
    pub fn found(&self, taken: &[Taken], found: &[Found]) {
        let mut f = self.lock();
        for t in taken {
            let Some(seq) = t.seq else { continue };
            let Some(read) = found.iter().find(|r| r.queue == t.queue) else {
                continue;
            };
            let Some(entry) = f.queues.get_mut(&t.queue) else {
                continue;
            };
            // A wake-up since the read began that it cannot account for:
            // one without a key, or a keyed one no longer kept.
            if entry.since > seq || entry.unkeyed > seq || entry.dropped > seq {
                continue;
            }
            let Some(first) = read.first else {
                // Nothing claimable at or above the start: it stays.
                continue;
            };
            let cap = ClaimKey {
                priority: first.priority,
                run_at: read.at - MARGIN,
                id: Uuid::nil(),
            };
            let mut floor = first.min(cap);
            for (_, key) in entry.recent.iter().filter(|(s, _)| *s > seq) {
                floor = floor.min(*key);
            }
            entry.floor = Some(floor);
        }
    }

    /// A wake-up of `queue`: a job there may have become claimable. `key`
    /// is the smallest key written (an enqueue knows it), `None` when not
    /// known: the queue's floor is dropped.
    pub fn wrote(&self, queue: &str, key: Option<ClaimKey>) {
        let mut f = self.lock();
        f.seq += 1;
        let seq = f.seq;
        let Some(entry) = f.queues.get_mut(queue) else {
            return;
        };
        match key {
            Some(key) => {
                if entry.floor.is_some_and(|floor| key < floor) {
                    entry.floor = Some(key);
                }
                entry.recent.push_back((seq, key));
                if entry.recent.len() > RECENT_WRITES
                    && let Some((dropped, _)) = entry.recent.pop_front()
                {
                    entry.dropped = dropped;
                }
            }
            None => {
                entry.floor = None;
                entry.unkeyed = seq;
            }
        }
    }

    /// Every queue may have claimable jobs (wake-ups may have been lost):
    /// every floor is dropped.
    pub fn forget_all(&self) {
        let mut f = self.lock();
        f.seq += 1;
        let seq = f.seq;
        for entry in f.queues.values_mut() {
            entry.floor = None;
            entry.unkeyed = seq;
        }
    }

    /// The queues with a floor and their floors, for the floor check.
    pub fn floored(&self) -> Vec<(String, ClaimKey)> {
        let f = self.lock();
        f.queues
            .iter()
            .filter_map(|(q, e)| Some((q.clone(), e.floor?)))
            .collect()
    }

    /// What a full scan that began after `before` was read (see
    /// [`ClaimFloors::floored`]) found: a floor a claimable job sorts below,
    /// now and before the scan, is lowered to it (a job was written below
    /// it without a wake-up reaching this coordinator). A job below the
    /// floor a queue had before the scan was below it when the scan read
    /// it; one only below a floor raised since (by a claim that took it)
    /// is no miss. Answers how many floors were lowered.
    pub fn lower(&self, before: &[(String, ClaimKey)], found: &[Found]) -> usize {
        let mut f = self.lock();
        let mut lowered = 0;
        for read in found {
            let Some(first) = read.first else { continue };
            let Some((_, floor_before)) = before.iter().find(|(q, _)| *q == read.queue) else {
                continue;
            };
            let Some(entry) = f.queues.get_mut(&read.queue) else {
                continue;
            };
            if first < *floor_before && entry.floor.is_some_and(|floor| first < floor) {
                entry.floor = Some(first);
                lowered += 1;
            }
        }
        lowered
    }
}

impl Floors {
    /// Whether a new queue fits, after dropping those idle for [`IDLE`].
    fn make_room(&mut self, now: Instant) -> bool {
        if self.queues.len() < MAX_QUEUES {
            return true;
        }
        self.queues.retain(|_, e| now.duration_since(e.used) < IDLE);
        self.queues.len() < MAX_QUEUES
    }
}

impl Taken {
    /// No floor and no read after the claim.
    fn bare(queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            floor: None,
            seq: None,
        }
    }

    /// Whether the claim reads the queue's first claimable job after it.
    pub fn reads_after(&self) -> bool {
        self.seq.is_some()
    }
}

/// Floors as the statements take them: parallel arrays, one element per
/// queue (NULL: no floor).
pub struct FloorParams {
    /// Each floor's priority.
    pub priority: Vec<Option<i32>>,
    /// Each floor's due time.
    pub run_at: Vec<Option<DateTime<Utc>>>,
    /// Each floor's job id.
    pub id: Vec<Option<Uuid>>,
}

impl FloorParams {
    /// No floor for each of `n` queues.
    pub fn none(n: usize) -> Self {
        Self {
            priority: vec![None; n],
            run_at: vec![None; n],
            id: vec![None; n],
        }
    }

    /// The floors of `taken`, in order.
    pub fn of(taken: &[&Taken]) -> Self {
        Self {
            priority: taken.iter().map(|t| t.floor.map(|k| k.priority)).collect(),
            run_at: taken.iter().map(|t| t.floor.map(|k| k.run_at)).collect(),
            id: taken.iter().map(|t| t.floor.map(|k| k.id)).collect(),
        }
    }
}

/// Reads `lease_claim_floor.sql`'s rows.
pub fn found_rows(rows: &[tokio_postgres::Row]) -> Result<Vec<Found>, StoreError> {
    rows.iter()
        .map(|row| {
            let first = if col::<bool>(row, "found")? {
                Some(ClaimKey {
                    priority: col(row, "priority")?,
                    run_at: col(row, "run_at")?,
                    id: col(row, "id")?,
                })
            } else {
                None
            };
            Ok(Found {
                queue: col(row, "queue")?,
                first,
                at: col(row, "at")?,
            })
        })
        .collect()
}

impl Store {
    /// The floor check: a full scan of each queue that has a floor, outside
    /// any claim, lowering floors a job sorts below. Answers the floors
    /// lowered.
    pub async fn check_claim_floors(&self) -> Result<usize, StoreError> {
        let Some(floors) = self.claim_floors() else {
            return Ok(0);
        };
        let before = floors.floored();
        if before.is_empty() {
            return Ok(0);
        }
        let queues: Vec<&str> = before.iter().map(|(q, _)| q.as_str()).collect();
        let starts = FloorParams::none(queues.len());
        let rows = self
            .timed("claim_floor_check", || async {
                let client = self.conn().await?;
                // Planned as a claim's scan is (sql::CLAIM_SCAN_PLANNING), in
                // a transaction of its own that only reads.
                client.batch_execute("BEGIN READ ONLY").await?;
                let read = async {
                    client.batch_execute(sql::CLAIM_SCAN_PLANNING).await?;
                    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                        [&queues, &starts.priority, &starts.run_at, &starts.id];
                    Ok::<_, StoreError>(client.query(sql::LEASE_CLAIM_FLOOR, &params).await?)
                }
                .await;
                client
                    .batch_execute(if read.is_ok() { "COMMIT" } else { "ROLLBACK" })
                    .await?;
                read
            })
            .await?;
        Ok(floors.lower(&before, &found_rows(&rows)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(priority: i32, secs: i64, id: u128) -> ClaimKey {
        ClaimKey {
            priority,
            run_at: DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap(),
            id: Uuid::from_u128(id),
        }
    }

    fn read(queue: &str, first: Option<ClaimKey>, at_secs: i64) -> Found {
        Found {
            queue: queue.into(),
            first,
            at: DateTime::from_timestamp(1_800_000_000 + at_secs, 0).unwrap(),
        }
    }

    #[test]
    fn a_read_moves_the_floor_no_later_than_the_margin_before_it() {
        let floors = ClaimFloors::new();
        let taken = floors.take(&["q"]);
        assert_eq!(taken[0].floor, None);
        // A backlog: the first claimable job is older than the margin.
        floors.found(&taken, &[read("q", Some(key(0, 10, 7)), 100)]);
        assert_eq!(floors.take(&["q"])[0].floor, Some(key(0, 10, 7)));
        // A fresh job: the floor stops a margin before the read.
        let taken = floors.take(&["q"]);
        floors.found(&taken, &[read("q", Some(key(0, 100, 9)), 100)]);
        let floor = floors.take(&["q"])[0].floor.unwrap();
        assert_eq!(floor, key(0, 99, 0));
        // Nothing claimable: the floor stays where it was.
        let taken = floors.take(&["q"]);
        floors.found(&taken, &[read("q", None, 200)]);
        assert_eq!(floors.take(&["q"])[0].floor, Some(floor));
    }

    #[test]
    fn a_keyed_wake_up_lowers_the_floor_and_the_reads_under_way() {
        let floors = ClaimFloors::new();
        let taken = floors.take(&["q"]);
        floors.found(&taken, &[read("q", Some(key(5, 10, 1)), 100)]);
        // An urgent job sorts below the floor: the floor follows it.
        floors.wrote("q", Some(key(0, 50, 2)));
        assert_eq!(floors.take(&["q"])[0].floor, Some(key(0, 50, 2)));
        // A read that began before another urgent write and did not see it
        // moves the floor no higher than that write.
        let taken = floors.take(&["q"]);
        floors.wrote("q", Some(key(1, 60, 3)));
        floors.found(&taken, &[read("q", Some(key(5, 20, 4)), 100)]);
        assert_eq!(floors.take(&["q"])[0].floor, Some(key(1, 60, 3)));
        // A later job does not move the floor.
        floors.wrote("q", Some(key(5, 99, 5)));
        assert_eq!(floors.take(&["q"])[0].floor, Some(key(1, 60, 3)));
    }

    #[test]
    fn a_wake_up_without_a_key_drops_the_floor_and_the_reads_under_way() {
        let floors = ClaimFloors::new();
        let taken = floors.take(&["q", "r"]);
        floors.found(
            &taken,
            &[
                read("q", Some(key(0, 10, 1)), 100),
                read("r", Some(key(0, 10, 1)), 100),
            ],
        );
        let taken = floors.take(&["q", "r"]);
        floors.wrote("q", None);
        assert_eq!(floors.take(&["q"])[0].floor, None);
        floors.found(
            &taken,
            &[
                read("q", Some(key(0, 20, 2)), 100),
                read("r", Some(key(0, 20, 2)), 100),
            ],
        );
        assert_eq!(floors.take(&["q"])[0].floor, None, "the read missed the write");
        assert_eq!(
            floors.take(&["r"])[0].floor,
            Some(key(0, 20, 2)),
            "another queue's write"
        );
        // More keyed wake-ups than are kept: the read cannot know them all.
        let taken = floors.take(&["r"]);
        for i in 0..=RECENT_WRITES as u128 {
            floors.wrote("r", Some(key(0, 30, i)));
        }
        floors.found(&taken, &[read("r", Some(key(0, 40, 2)), 100)]);
        assert_eq!(floors.take(&["r"])[0].floor, Some(key(0, 20, 2)));
        floors.forget_all();
        assert_eq!(floors.take(&["r"])[0].floor, None);
    }

    #[test]
    fn not_hearing_every_coordinator_means_no_floors() {
        let floors = ClaimFloors::new();
        let taken = floors.take(&["q"]);
        floors.found(&taken, &[read("q", Some(key(0, 10, 1)), 100)]);
        floors.hearing(false);
        let taken = floors.take(&["q"]);
        assert_eq!(taken[0].floor, None);
        assert!(!taken[0].reads_after());
        floors.hearing(true);
        assert!(floors.take(&["q"])[0].reads_after());
    }

    #[test]
    fn a_full_scan_lowers_a_floor_a_job_sorts_below_and_counts_it() {
        let floors = ClaimFloors::new();
        let taken = floors.take(&["q"]);
        floors.found(&taken, &[read("q", Some(key(0, 10, 1)), 100)]);
        let before = floors.floored();
        assert_eq!(floors.lower(&before, &[read("q", Some(key(0, 20, 1)), 100)]), 0);
        assert_eq!(floors.lower(&before, &[read("q", Some(key(-1, 20, 1)), 100)]), 1);
        assert_eq!(floors.take(&["q"])[0].floor, Some(key(-1, 20, 1)));
        // A job below a floor raised during the scan, not below the one
        // before it, was claimable when the scan read it: no miss.
        let before = floors.floored();
        let taken = floors.take(&["q"]);
        floors.found(&taken, &[read("q", Some(key(0, 50, 1)), 100)]);
        assert_eq!(floors.lower(&before, &[read("q", Some(key(0, 30, 1)), 100)]), 0);
        assert_eq!(floors.take(&["q"])[0].floor, Some(key(0, 50, 1)));
    }

    #[test]
    fn queues_beyond_the_cap_have_no_floor() {
        let floors = ClaimFloors::new();
        let names: Vec<String> = (0..MAX_QUEUES).map(|i| format!("q{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(floors.take(&refs).iter().all(Taken::reads_after));
        assert!(!floors.take(&["one-more"])[0].reads_after());
    }
}
