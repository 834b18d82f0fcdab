//! The claim batcher: parked claimers of the same queues are served by one
//! claim statement whose slots are the sum of what they asked for, and the
//! rows are handed out in arrival order. A wake-up for one of the queues or
//! the re-check timer makes a group look again; a claim that joins a
//! resting group (or makes a new one) looks by itself first, unless its
//! queues are known to hold no claimable job and it may wait: then it
//! parks at once. A claimer whose wait ran out is
//! answered with an empty list. Parked claimers wait on shelves
//! (`batch/shelf.rs`), where an enqueue may take them to serve them in its
//! own transaction. With batching off, each claim runs its own statements
//! (the per-request mode).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use runlease_protocol::{QueueName, WorkerId};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::batch::plan::{ClaimPlan, GroupKey, Placement};
pub use crate::batch::shelf::TakenClaimer;
use crate::batch::shelf::{Group, SharedShelf, lock};
use crate::batch::{BatchSettings, Parts};
use crate::flow::FlowControl;
use crate::metrics::{LimitLabels, Metrics};
use crate::store::leases::{Claimed, LeaseRef};
use crate::store::rows::ClaimedJob;
use crate::store::{Store, StoreError};
use crate::wake::{Wake, jittered, next_queue_wake};

/// One claim request.
#[derive(Debug, Clone)]
pub struct ClaimAsk {
    /// Queues, sorted and without repeats.
    pub queues: Vec<QueueName>,
    /// The claiming worker.
    pub worker: WorkerId,
    /// Most leases wanted.
    pub max_jobs: u32,
    /// The worker's remaining run time.
    pub time_left_ms: Option<u64>,
    /// How long it may park.
    pub wait: Duration,
}

pub(super) struct Parked {
    pub(super) ask: ClaimAsk,
    pub(super) deadline: Instant,
    pub(super) reply: oneshot::Sender<Result<Vec<ClaimedJob>, StoreError>>,
    /// Parked without a look (its queues were known empty): at its
    /// deadline its group looks before it is answered.
    pub(super) unlooked: bool,
}

/// Serves claims. With batching on, claims are spread over a few shards
/// (`RUNLEASE_BATCH_FLUSHERS`), each a loop with its own claim statement in
/// flight, so a busy queue's claims use more than one connection.
#[derive(Clone)]
pub struct ClaimBatcher {
    pub(super) shards: Arc<Vec<mpsc::UnboundedSender<Parked>>>,
    pub(super) shelves: Arc<Vec<SharedShelf>>,
    pub(super) next_shard: Arc<AtomicUsize>,
    store: Store,
    flow: Arc<FlowControl>,
    wake: Wake,
    pub(super) metrics: Arc<Metrics>,
    recheck: Duration,
    max_slots: usize,
    shutdown: CancellationToken,
}

impl ClaimBatcher {
    /// A claim batcher over `store`; with batching on, its loop runs on `tracker`
    /// until every handle is dropped. At `shutdown` parked claims are
    /// answered with empty lists and new ones are answered at once.
    pub fn spawn(
        parts: &Parts,
        settings: BatchSettings,
        recheck: Duration,
        tracker: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        let mut this = Self {
            shards: Arc::default(),
            shelves: Arc::default(),
            next_shard: Arc::default(),
            store: parts.store.clone(),
            flow: parts.flow.clone(),
            wake: parts.wake.clone(),
            metrics: parts.metrics.clone(),
            recheck,
            max_slots: settings.max_size.max(1),
            shutdown,
        };
        if settings.enabled {
            let (mut shards, mut shelves) = (Vec::new(), Vec::new());
            for _ in 0..settings.claim_shards.max(1) {
                let (tx, rx) = mpsc::unbounded_channel();
                let shelf = SharedShelf::default();
                // A loop holds no sender (its own or another shard's): it
                // ends once every handle is dropped.
                tracker.spawn(this.clone().run(rx, shelf.clone()));
                shards.push(tx);
                shelves.push(shelf);
            }
            this.shards = Arc::new(shards);
            this.shelves = Arc::new(shelves);
        }
        this
    }

    /// Claims up to `ask.max_jobs` leases, parking up to `ask.wait` when none
    /// is claimable.
    pub async fn claim(&self, ask: ClaimAsk) -> Result<Vec<ClaimedJob>, StoreError> {
        let deadline = Instant::now() + ask.wait;
        if self.shards.is_empty() {
            // Boxed: its statements' futures would size every parked
            // claim's future (batching on, the usual) for this path.
            return Box::pin(self.claim_alone(ask, deadline)).await;
        }
        let shard = self.next_shard.fetch_add(1, Ordering::Relaxed) % self.shards.len();
        let tx = &self.shards[shard];
        let (reply, answer) = oneshot::channel();
        tx.send(Parked {
            ask,
            deadline,
            reply,
            unlooked: false,
        })
        .map_err(|_| StoreError::Unavailable("the coordinator is shutting down".into()))?;
        answer.await.unwrap_or_else(|_| Ok(Vec::new()))
    }

    /// The per-request mode: this claim's own statements, re-checking on
    /// wake-ups and the timer.
    async fn claim_alone(&self, ask: ClaimAsk, deadline: Instant) -> Result<Vec<ClaimedJob>, StoreError> {
        // Subscribed before the first look: an enqueue in between still wakes us.
        let mut wakes = self.wake.subscribe_queues();
        // A statement of its own: as many slots as it asks for.
        let mut plan = ClaimPlan::new(ask.max_jobs as usize);
        plan.place(&ask);
        let mut waiting = None;
        loop {
            let claimed = self.claim_planned(&ask.queues, &plan).await?;
            if !claimed.rows.is_empty() {
                return Ok(claimed.rows.into_iter().map(|(_, r)| r).collect());
            }
            let now = Instant::now();
            if now >= deadline || self.shutdown.is_cancelled() {
                return Ok(Vec::new());
            }
            waiting.get_or_insert_with(|| crate::metrics::WaiterGauge::new(&self.metrics.claim_waiters));
            let nap = jittered(self.recheck)
                .min(claimed.retry_in.unwrap_or(Duration::MAX))
                .min(deadline - now);
            tokio::select! {
                () = next_queue_wake(&mut wakes, &ask.queues) => {}
                () = tokio::time::sleep(nap) => {}
                () = self.shutdown.cancelled() => {}
            }
        }
    }

    async fn run(self, mut rx: mpsc::UnboundedReceiver<Parked>, shelf: SharedShelf) {
        let mut wakes = self.wake.subscribe_queues();
        let mut stopping = false;
        loop {
            let next_timer = lock(&shelf).next_timer();
            tokio::select! {
                parked = rx.recv() => {
                    let Some(parked) = parked else { break };
                    let mut shelf = lock(&shelf);
                    self.admit(&mut shelf.groups, parked, stopping);
                    while let Ok(parked) = rx.try_recv() {
                        self.admit(&mut shelf.groups, parked, stopping);
                    }
                }
                wake = wakes.recv() => mark_woken(&mut lock(&shelf).groups, wake),
                () = async {
                    match next_timer {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => {
                    let now = Instant::now();
                    for group in lock(&shelf).groups.values_mut() {
                        if group.next_check <= now {
                            group.dirty = true;
                        }
                    }
                }
                () = self.shutdown.cancelled(), if !stopping => {
                    stopping = true;
                    for parked in lock(&shelf).groups.drain().flat_map(|(_, g)| g.parked.into_iter().chain(g.fresh)) {
                        let _ = parked.reply.send(Ok(Vec::new()));
                    }
                }
            }
            {
                let mut shelf = lock(&shelf);
                let groups = &mut shelf.groups;
                // Wake-ups that came while the last statement ran are
                // served by this one (a woken group's claimers are not
                // expired before it).
                mark_pending(groups, &mut wakes);
                // Scanning every parked claim is only needed once a
                // deadline passed.
                if next_timer.is_some_and(|at| at <= Instant::now()) {
                    self.expire(groups);
                }
            }
            self.serve_dirty(&shelf).await;
            lock(&shelf).recount(&self.metrics.claim_waiters);
        }
        let mut shelf = lock(&shelf);
        self.metrics.claim_waiters.dec_by(shelf.counted);
        shelf.counted = 0;
    }

    /// Serves every group marked dirty, each out of the shelf while its
    /// statement runs, and the fresh claimers of the others (their group
    /// stays on the shelf); a group left with nobody parked goes.
    async fn serve_dirty(&self, shelf: &SharedShelf) {
        // Twice at most: newcomers that found jobs make their group dirty,
        // and a group served whole rests or goes.
        loop {
            let due: Vec<(GroupKey, bool)> = lock(shelf)
                .groups
                .iter()
                .filter(|(_, g)| g.dirty || !g.fresh.is_empty())
                .map(|(k, g)| (k.clone(), g.dirty))
                .collect();
            if due.is_empty() {
                return;
            }
            self.serve_due(shelf, due).await;
        }
    }

    /// Serves each of `due`: a whole group out of the shelf, or the fresh
    /// claimers of one (`false`).
    async fn serve_due(&self, shelf: &SharedShelf, due: Vec<(GroupKey, bool)>) {
        for (key, whole) in due {
            let taken = {
                let mut shelf = lock(shelf);
                if whole {
                    shelf.groups.remove(&key).map(|mut group| {
                        let fresh = std::mem::take(&mut group.fresh);
                        group.parked.extend(fresh);
                        (group, false)
                    })
                } else {
                    shelf.groups.get_mut(&key).map(|group| {
                        let newcomers = Group {
                            parked: std::mem::take(&mut group.fresh),
                            ..Group::new(true, group.next_check)
                        };
                        (newcomers, !group.parked.is_empty())
                    })
                }
            };
            // Gone when an enqueue took its every claimer meanwhile.
            let Some((mut served, others_parked)) = taken else {
                continue;
            };
            let found = if !whole && self.known_empty(&key, &served) {
                self.park_unlooked(&mut served);
                false
            } else {
                self.serve(&key, &mut served).await
            };
            // Newcomers that found jobs without a wake-up (a delayed job
            // come due, a wake-up lost) show that the group's parked
            // claimers may find some too: they look next.
            let stale = found && others_parked;
            if served.is_empty() && !stale {
                continue;
            }
            // Only this loop adds claimers: those left wait with the
            // group's.
            let mut shelf = lock(shelf);
            let group = shelf
                .groups
                .entry(key)
                .or_insert_with(|| Group::new(served.dirty, served.next_check));
            group.next_check = group.next_check.min(served.next_check);
            group.dirty |= stale;
            group.parked.extend(served.parked);
        }
    }

    fn admit(&self, groups: &mut HashMap<GroupKey, Group>, parked: Parked, stopping: bool) {
        if stopping {
            let _ = parked.reply.send(Ok(Vec::new()));
            return;
        }
        let key = GroupKey::of(&parked.ask);
        // A new group rests from the start: its first claimers look as
        // newcomers (or park at once when their queues are known empty).
        let group = groups
            .entry(key)
            .or_insert_with(|| Group::new(false, Instant::now() + jittered(self.recheck)));
        if group.dirty {
            group.parked.push_back(parked);
        } else {
            // The group's own claimers stay parked: nothing was claimable
            // for them when they last looked, and a wake-up tells them
            // otherwise.
            group.fresh.push_back(parked);
        }
    }

    /// Answers claimers whose wait ran out, and forgets those who left
    /// (fresh claimers look once first, whatever their wait; one parked
    /// without a look makes its group look first).
    fn expire(&self, groups: &mut HashMap<GroupKey, Group>) {
        let now = Instant::now();
        for group in groups.values_mut() {
            group.fresh.retain(|p| !p.reply.is_closed());
            let mut kept = VecDeque::with_capacity(group.parked.len());
            for parked in group.parked.drain(..) {
                if parked.reply.is_closed() {
                    continue;
                }
                if parked.deadline <= now && !group.dirty {
                    if parked.unlooked {
                        group.dirty = true;
                    } else {
                        let _ = parked.reply.send(Ok(Vec::new()));
                        continue;
                    }
                }
                kept.push_back(parked);
            }
            group.parked = kept;
        }
        groups.retain(|_, g| !g.is_empty());
    }

    /// Runs claim statements for a group until it is served or nothing more
    /// is claimable; parked claimers whose wait ran out are then answered.
    /// Answers whether its statements claimed anything.
    async fn serve(&self, key: &GroupKey, group: &mut Group) -> bool {
        let mut found = false;
        loop {
            group.parked.retain(|p| !p.reply.is_closed());
            if group.parked.is_empty() {
                return found;
            }
            // This statement is their look.
            group.parked.iter_mut().for_each(|p| p.unlooked = false);
            let mut plan = ClaimPlan::new(self.max_slots);
            // In arrival order, as far as the statement has room.
            let placements: Vec<Placement> = group.parked.iter().map_while(|p| plan.place(&p.ask)).collect();
            let wanted = plan.slots();
            let claimed = match self.claim_planned(&key.queues, &plan).await {
                Ok(claimed) => claimed,
                Err(e) => {
                    for parked in group.parked.drain(..) {
                        let _ = parked.reply.send(Err(e.clone()));
                    }
                    return found;
                }
            };
            let (retry_in, got) = (claimed.retry_in, claimed.rows.len());
            found |= got > 0;
            let mut dealt = plan.deal(vec![claimed.rows]);
            // Served claimers leave; the others keep their place, in
            // arrival order.
            let placed: Vec<Parked> = group.parked.drain(..placements.len()).collect();
            let mut waiting = VecDeque::with_capacity(group.parked.len() + placed.len());
            for (parked, placement) in placed.into_iter().zip(placements) {
                let records = dealt.take(placement);
                if records.is_empty() {
                    waiting.push_back(parked);
                } else if let Err(Ok(records)) = parked.reply.send(Ok(records)) {
                    self.release_unwanted(&parked.ask.worker, records).await;
                }
            }
            waiting.extend(group.parked.drain(..));
            group.parked = waiting;
            if got < wanted {
                self.rest(group, retry_in);
                return found;
            }
        }
    }

    /// Whether newcomers may park without looking: their queues are all
    /// known to hold no claimable job (see [`crate::store::floors`]) and
    /// each is willing to wait. A claimer that may not wait looks, so that
    /// its answer reads the database (an enqueue acknowledged by another
    /// coordinator may not have reached this one yet).
    fn known_empty(&self, key: &GroupKey, newcomers: &Group) -> bool {
        let willing = newcomers.parked.iter().all(|p| !p.ask.wait.is_zero());
        willing && self.store.claim_floors().is_some_and(|f| f.empty(&key.queues))
    }

    /// Parks newcomers that skipped their look as if they had found
    /// nothing, except that none is answered before its group has looked
    /// ([`Parked::unlooked`]). Counted.
    fn park_unlooked(&self, newcomers: &mut Group) {
        newcomers.parked.retain(|p| !p.reply.is_closed());
        newcomers.parked.iter_mut().for_each(|p| p.unlooked = true);
        self.metrics
            .claims_parked_unlooked
            .inc_by(newcomers.parked.len() as u64);
        newcomers.dirty = false;
        newcomers.next_check = Instant::now() + jittered(self.recheck);
    }

    /// Nothing more is claimable for `group` now: it waits for a wake-up or
    /// its timer (a rate-limited queue's next token, when sooner), and the
    /// claimers whose wait ran out are answered with nothing.
    fn rest(&self, group: &mut Group, retry_in: Option<Duration>) {
        group.dirty = false;
        group.next_check = Instant::now() + jittered(self.recheck).min(retry_in.unwrap_or(Duration::MAX));
        let now = Instant::now();
        let (expired, waiting): (VecDeque<Parked>, VecDeque<Parked>) =
            group.parked.drain(..).partition(|p| p.deadline <= now);
        for parked in expired {
            let _ = parked.reply.send(Ok(Vec::new()));
        }
        group.parked = waiting;
    }

    /// Runs the claim of a plan of one group (the limited path for its
    /// queues with limits).
    async fn claim_planned(&self, queues: &[QueueName], plan: &ClaimPlan<'_>) -> Result<Claimed, StoreError> {
        let Some(group) = plan.claims().pop() else {
            return Ok(Claimed::default());
        };
        self.metrics.batch("claim", group.slots.len());
        let limited = self.flow.limited(queues);
        let claimed = self
            .store
            .claim(queues, &group.slots, group.time_left_ms, &limited)
            .await?;
        self.count_held_back(&claimed);
        Ok(claimed)
    }

    fn count_held_back(&self, claimed: &Claimed) {
        for (queue, kind, _) in &claimed.held_back {
            self.metrics
                .claims_held_back
                .get_or_create(&LimitLabels {
                    queue: queue.to_string(),
                    limit: kind.as_str().to_owned(),
                })
                .inc();
        }
    }

    /// Leases claimed for a claimer that left before its answer: see
    /// [`release_unwanted`].
    pub(super) async fn release_unwanted(&self, worker: &WorkerId, records: Vec<ClaimedJob>) {
        release_unwanted(&self.store, &self.wake, worker, records).await;
    }
}

/// Marks the groups a wake-up concerns for another look.
fn mark_woken(
    groups: &mut HashMap<GroupKey, Group>,
    wake: Result<Option<QueueName>, broadcast::error::RecvError>,
) {
    match wake {
        Ok(Some(queue)) => {
            for (key, group) in groups.iter_mut() {
                if key.queues.contains(&queue) {
                    group.dirty = true;
                }
            }
        }
        // A wake-all, or a lag that may have hidden one.
        Ok(None) | Err(broadcast::error::RecvError::Lagged(_)) => {
            groups.values_mut().for_each(|g| g.dirty = true);
        }
        Err(broadcast::error::RecvError::Closed) => {}
    }
}

/// Marks the groups of every wake-up already waiting: those that came while
/// the last statement ran are served by one statement after them all (each
/// job they announce was committed before it), not by a statement each.
fn mark_pending(groups: &mut HashMap<GroupKey, Group>, wakes: &mut broadcast::Receiver<Option<QueueName>>) {
    loop {
        let wake = match wakes.try_recv() {
            Ok(wake) => Ok(wake),
            Err(broadcast::error::TryRecvError::Lagged(n)) => Err(broadcast::error::RecvError::Lagged(n)),
            Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed) => return,
        };
        mark_woken(groups, wake);
    }
}

/// Leases claimed for a claimer that left before its answer: given back at
/// once instead of left to expire (no attempt charged), their queues woken.
pub(crate) async fn release_unwanted(
    store: &Store,
    wake: &Wake,
    worker: &WorkerId,
    records: Vec<ClaimedJob>,
) {
    tracing::info!(
        leases = records.len(),
        "claimer left before its answer: releasing its leases"
    );
    let leases = records
        .iter()
        .map(|r| LeaseRef {
            job_id: r.id,
            run_lease: r.run_lease,
            worker_id: worker.clone(),
        })
        .collect();
    store.give_back(leases).await;
    for r in &records {
        wake.ready(&r.queue);
    }
}
