//! The shelves of the claim batcher: the claimers parked in each of its
//! loops, by group, shared with the enqueuer, which takes some to serve
//! them in its own transaction (ADR 036).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use runlease_protocol::QueueName;
use tokio::time::Instant;

use crate::batch::claims::{ClaimAsk, ClaimBatcher, Parked};
use crate::batch::plan::GroupKey;
use crate::store::rows::ClaimedJob;

/// Claimers parked for the same queues and time-left band.
pub(super) struct Group {
    /// Claimers that looked and wait, in arrival order.
    pub(super) parked: VecDeque<Parked>,
    /// Claimers that joined the group while it rested and have not looked
    /// yet: served by a statement of their own, so that those parked stay
    /// on the shelf meanwhile (an enqueue may serve them).
    pub(super) fresh: VecDeque<Parked>,
    /// Every claimer must look again (a wake-up, the timer, the deadline of
    /// one parked without a look).
    pub(super) dirty: bool,
    pub(super) next_check: Instant,
}

impl Group {
    pub(super) fn new(dirty: bool, next_check: Instant) -> Self {
        Self {
            parked: VecDeque::new(),
            fresh: VecDeque::new(),
            dirty,
            next_check,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.parked.len() + self.fresh.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.parked.is_empty() && self.fresh.is_empty()
    }
}

/// The claimers parked in one shard, by group: its loop's, shared with
/// the enqueuer, which may take some to serve in its own transaction
/// ([`ClaimBatcher::take_parked`]). A group being served is out of it
/// while its statement runs, so nobody else can take its claimers then.
#[derive(Default)]
pub(super) struct Shelf {
    pub(super) groups: HashMap<GroupKey, Group>,
    /// Parked claimers last added to the waiters' gauge.
    pub(super) counted: i64,
}

impl Shelf {
    /// Brings the waiters' gauge to what is parked here now (shards
    /// share the gauge: each adds what changed on its side).
    pub(super) fn recount(&mut self, gauge: &prometheus_client::metrics::gauge::Gauge) {
        let parked: i64 = self.groups.values().map(|g| g.len() as i64).sum();
        gauge.inc_by(parked - self.counted);
        self.counted = parked;
    }

    /// The earliest deadline or re-check of any group.
    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.groups
            .values()
            .flat_map(|g| {
                g.parked
                    .iter()
                    .map(|p| p.deadline)
                    .chain(std::iter::once(g.next_check))
            })
            .min()
    }
}

pub(super) type SharedShelf = Arc<Mutex<Shelf>>;

pub(super) fn lock(shelf: &SharedShelf) -> std::sync::MutexGuard<'_, Shelf> {
    // A shelf holds no invariant a panic could break halfway.
    shelf.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A parked claimer an enqueue took from its shard to serve it in the
/// enqueue's own transaction ([`ClaimBatcher::take_parked`]).
pub struct TakenClaimer {
    parked: Parked,
    shard: usize,
}

impl TakenClaimer {
    /// What it asked for.
    pub fn ask(&self) -> &ClaimAsk {
        &self.parked.ask
    }
}

impl ClaimBatcher {
    /// Takes claimers parked for `queue` alone, without a time limit (a
    /// claim an enqueue's statement can serve as it is), in arrival order,
    /// until they ask for at least `jobs` leases (so that each has a job
    /// of the `jobs` the enqueue makes claimable). The enqueue serves them
    /// in its transaction; those it cannot serve go back
    /// ([`ClaimBatcher::put_back`]).
    pub fn take_parked(&self, queue: &QueueName, jobs: usize) -> Vec<TakenClaimer> {
        let key = GroupKey {
            queues: vec![queue.clone()],
            time_left_band: None,
        };
        let mut taken = Vec::new();
        let mut slots = 0;
        // Each enqueue starts at another shard, so that none is always last.
        let n = self.shelves.len();
        let first = self.next_shard.fetch_add(1, Ordering::Relaxed);
        for shard in (0..n).map(|i| (first + i) % n) {
            if slots >= jobs {
                break;
            }
            let before = taken.len();
            let mut shelf = lock(&self.shelves[shard]);
            let Some(group) = shelf.groups.get_mut(&key) else {
                continue;
            };
            // Those parked longest first.
            while slots < jobs
                && let Some(parked) = group.parked.pop_front().or_else(|| group.fresh.pop_front())
            {
                // One that left needs nothing; its shard would drop it.
                if parked.reply.is_closed() {
                    continue;
                }
                slots += parked.ask.max_jobs as usize;
                taken.push(TakenClaimer { parked, shard });
            }
            if group.is_empty() {
                shelf.groups.remove(&key);
            }
            // Counted off as taken (a group off the shelf for its
            // statement is still counted: a recount would drop it).
            let gone = (taken.len() - before) as i64;
            self.metrics.claim_waiters.dec_by(gone);
            shelf.counted -= gone;
        }
        taken
    }

    /// Hands a taken claimer what the enqueue claimed for it: its leases,
    /// or, when it got none, back to its shard to park again (a claimer
    /// that left has its leases given back).
    pub async fn hand_taken(&self, taken: TakenClaimer, leases: Vec<ClaimedJob>) {
        if leases.is_empty() {
            self.put_back(taken);
        } else if let Err(Ok(leases)) = taken.parked.reply.send(Ok(leases)) {
            self.release_unwanted(&taken.parked.ask.worker, leases).await;
        }
    }

    /// A taken claimer back to its shard, as a new claim (it looks at
    /// once, or parks unlooked while its queue is known empty).
    pub fn put_back(&self, taken: TakenClaimer) {
        if let Some(tx) = self.shards.get(taken.shard) {
            // A shard gone (shutting down) drops the reply: answered empty.
            let _ = tx.send(taken.parked);
        }
    }
}
