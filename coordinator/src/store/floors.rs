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
//!
//! The same reads tell when a queue holds no claimable job at all (due or
//! not): a read after a claim that found none, with no wake-up of the
//! queue since its claim took the floor, marks the queue *empty*, and the
//! next wake-up of the queue (or any floor being dropped) clears the mark.
//! While a claim's queues are all marked, a claimer that arrives to wait
//! parks without a statement ([`ClaimFloors::empty`]): the statement would
//! find nothing, and the wake-up that clears the mark is the one that would
//! have woken it. The floor check scans marked queues too (a job it finds
//! there clears the mark).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use runlease_protocol::QueueName;
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
    /// The last read found no claimable job, and no wake-up came since:
    /// [`Floors::seq`] when it was marked.
    empty: Option<u64>,
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
                    empty: None,
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
        let now = f.seq;
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
            // The keys written since the read began.
            let mut since = entry
                .recent
                .iter()
                .filter(|(s, _)| *s > seq)
                .map(|(_, k)| *k)
                .peekable();
            let Some(first) = read.first else {
                // Nothing claimable at or above the start: the floor stays,
                // and the queue is empty unless a job was written since.
                entry.empty = since.peek().is_none().then_some(now);
                continue;
            };
            entry.empty = None;
            let cap = ClaimKey {
                priority: first.priority,
                run_at: read.at - MARGIN,
                id: Uuid::nil(),
            };
            entry.floor = Some(since.fold(first.min(cap), ClaimKey::min));
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
        entry.empty = None;
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
            entry.empty = None;
        }
    }

    /// Whether every one of `queues` is marked empty: a claim of them would
    /// find nothing until a wake-up of one of them passes here.
    pub fn empty(&self, queues: &[QueueName]) -> bool {
        if !self.hearing.load(Ordering::Relaxed) || queues.is_empty() {
            return false;
        }
        let f = self.lock();
        queues
            .iter()
            .all(|q| f.queues.get(q.as_str()).is_some_and(|e| e.empty.is_some()))
    }

    /// The queues with a floor or an empty mark, as they stand, for the
    /// floor check (marks of queues no claim asked for in [`IDLE`] are left
    /// out: their scans would be for nobody).
    pub fn floored(&self) -> Vec<Floored> {
        let f = self.lock();
        let now = Instant::now();
        f.queues
            .iter()
            .filter(|(_, e)| e.floor.is_some() || (e.empty.is_some() && now.duration_since(e.used) < IDLE))
            .map(|(q, e)| Floored {
                queue: q.clone(),
                floor: e.floor,
                empty: e.empty,
            })
            .collect()
    }

    /// What a full scan that began after `before` was read (see
    /// [`ClaimFloors::floored`]) found: a floor a claimable job sorts below,
    /// now and before the scan, is lowered to it (a job was written below
    /// it without a wake-up reaching this coordinator). A job below the
    /// floor a queue had before the scan was below it when the scan read
    /// it; one only below a floor raised since (by a claim that took it)
    /// is no miss. An empty mark a job found contradicts goes, and is a
    /// miss when it is the mark that stood before the scan and the job was
    /// due a [`MARGIN`] before the scan's read (a wake-up on its way is
    /// not lost). Answers the misses.
    pub fn lower(&self, before: &[Floored], found: &[Found]) -> usize {
        let mut f = self.lock();
        let mut missed = 0;
        for read in found {
            let Some(first) = read.first else { continue };
            let Some(was) = before.iter().find(|b| b.queue == read.queue) else {
                continue;
            };
            let Some(entry) = f.queues.get_mut(&read.queue) else {
                continue;
            };
            let mut miss = false;
            if entry.empty.is_some() {
                miss = entry.empty == was.empty && first.run_at < read.at - MARGIN;
                entry.empty = None;
            }
            let below = |floor: Option<ClaimKey>| floor.is_some_and(|floor| first < floor);
            if below(was.floor) && below(entry.floor) {
                entry.floor = Some(first);
                miss = true;
            }
            missed += usize::from(miss);
        }
        missed
    }
}

/// A queue's floor and empty mark as the floor check found them before
/// its scan.
#[derive(Debug, Clone)]
pub struct Floored {
    /// The queue.
    pub queue: String,
    floor: Option<ClaimKey>,
    empty: Option<u64>,
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
        let queues: Vec<&str> = before.iter().map(|b| b.queue.as_str()).collect();
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
mod tests;
