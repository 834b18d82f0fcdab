//! Worker operations. Every write here after the claim is one statement guarded
//! on `(id, state = 'running', run_lease)`; a guard that matches no row means
//! the caller's lease is stale.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};

use runlease_protocol::worker::FinishAction;
use runlease_protocol::{AttemptOutcome, JobId, JobState, QueueName, RunLease, WorkerId};
use serde_json::Value;
use uuid::Uuid;

use crate::store::retry::{self, DeadLetter};
use crate::store::rows::{ClaimedJob, DbJobState, DbOutcome, col, queue_col};
use crate::store::tally::{Open, Tallied};
use crate::store::{Store, StoreError, dependencies, ms, sql};

use crate::store::claims::{ClaimSend, FloorsRead, GroupLeases};
pub use crate::store::claims::{Claimed, LimitKind, Requeued};
use crate::store::floors::ClaimKey;
use crate::store::floors::Found;
pub use crate::store::heartbeat::Renewal;

/// One way an attempt ends by its worker's hand: an item of `lease_finish.sql`.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// Done, with a result.
    Complete {
        /// The job's result.
        result: Value,
    },
    /// Failed: retried, failed for good, or cancelled.
    Fail {
        /// What went wrong.
        error: String,
        /// Whether another attempt may help.
        retryable: bool,
        /// The worker's retry delay; backoff when `None`.
        retry_after_ms: Option<i64>,
    },
    /// Handed back without charge.
    Release {
        /// Checkpoint for the next attempt; `None` keeps the saved one.
        progress: Option<Value>,
        /// How long the job waits before it may be claimed again (an
        /// endpoint's `Retry-After` or backoff); `None`: claimable at once.
        delay_ms: Option<i64>,
    },
}

impl Outcome {
    /// Whether an attempt that ended with `recorded` is this outcome already
    /// applied (so a repeat answers 200 instead of 409).
    fn matches(&self, recorded: AttemptOutcome) -> bool {
        match self {
            Outcome::Complete { .. } => recorded == AttemptOutcome::Completed,
            Outcome::Fail { .. } => {
                matches!(recorded, AttemptOutcome::Failed | AttemptOutcome::Cancelled)
            }
            Outcome::Release { .. } => {
                matches!(recorded, AttemptOutcome::Released | AttemptOutcome::Cancelled)
            }
        }
    }

    /// Which action this is (its data aside).
    pub fn action(&self) -> FinishAction {
        match self {
            Outcome::Complete { .. } => FinishAction::Complete,
            Outcome::Fail { .. } => FinishAction::Fail,
            Outcome::Release { .. } => FinishAction::Release,
        }
    }
}

/// What [`Store::finish_then_claim_limited`] answers: the items' endings,
/// each claim's leases (with the slot, 0-based, each filled), and the slots
/// a queue's limits held back (by queue and kind of limit).
pub type FinishedAndClaimed = (
    Vec<Ending>,
    Vec<Vec<(usize, ClaimedJob)>>,
    Vec<(QueueName, LimitKind, usize)>,
);

/// Each claim's leases, the slots limits held back, what the floor read found.
type ClaimsEnded = (GroupLeases, Vec<(QueueName, LimitKind, usize)>, Vec<Found>);

/// A lease's identity as read from a verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    /// The job.
    pub job_id: JobId,
    /// The lease.
    pub run_lease: RunLease,
    /// The worker the lease was handed to.
    pub worker_id: WorkerId,
}

/// Whether an attempt recorded as `recorded` (outcome, worker) is `outcome`
/// already applied under `lease`: same worker, matching outcome.
fn is_repeat(recorded: Option<&Ended>, lease: &LeaseRef, outcome: &Outcome) -> bool {
    recorded.is_some_and(|(o, worker)| worker == lease.worker_id.as_str() && outcome.matches(*o))
}

/// How a finish item ended when it applied: what its answer, its metrics
/// and its wake-ups need, not the whole job.
#[derive(Debug, Clone)]
pub struct Finished {
    /// The job.
    pub job_id: JobId,
    /// Its queue.
    pub queue: QueueName,
    /// Its state after the finish.
    pub state: JobState,
    /// When it was enqueued (for the SLO figure).
    pub created_at: DateTime<Utc>,
    /// When it became terminal, if it is.
    pub finished_at: Option<DateTime<Utc>>,
    /// False when this was a repeat of an outcome already applied.
    pub first: bool,
    /// Whether the job carries trace context (its transitions are logged
    /// at `info`).
    pub traced: bool,
    /// The follow-up its failure for good enqueued on its queue's
    /// dead-letter queue (only where this finish applied it).
    pub dead_letter: Option<DeadLetter>,
    /// Where this finish queued the job again (a release or a retry), its
    /// place in the claim order.
    pub requeued: Option<ClaimKey>,
}

impl Finished {
    fn from_row(row: &tokio_postgres::Row, first: bool) -> Result<Self, StoreError> {
        let job_id = JobId(col(row, "id")?);
        let state = col::<DbJobState>(row, "state")?.0;
        let requeued = if first { requeued_key(row, state)? } else { None };
        Ok(Self {
            job_id,
            queue: queue_col(row, "queue")?,
            state,
            created_at: col(row, "created_at")?,
            finished_at: col(row, "finished_at")?,
            first,
            traced: col(row, "traced")?,
            dead_letter: DeadLetter::from_row(row)?,
            requeued,
        })
    }
}

/// How an attempt ended, as its chronology row says: outcome and worker.
type Ended = (AttemptOutcome, String);

/// What a finish answers for one item.
#[derive(Debug, Clone)]
pub enum Ending {
    /// The outcome took effect (or, with `first: false`, had already taken
    /// effect under this same lease).
    Applied(Finished),
    /// The lease is stale; the job's state now (`None`: no such job).
    Lost(Option<JobState>),
}

/// One claim of [`Store::finish_then_claim`]: queues, one slot per lease
/// wanted (each naming its worker), the claimers' time left.
#[derive(Debug)]
pub struct ClaimGroup<'a> {
    /// Queues, sorted and without repeats.
    pub queues: &'a [QueueName],
    /// One slot per lease wanted.
    pub slots: Vec<&'a WorkerId>,
    /// The claimers' remaining run time.
    pub time_left_ms: Option<u64>,
}

/// The parameters of `lease_finish.sql` for a list of items (parallel
/// arrays, one element per item), borrowed from the items.
struct FinishArgs<'a> {
    ids: Vec<Uuid>,
    leases: Vec<i64>,
    actions: Vec<&'static str>,
    results: Vec<Option<&'a Value>>,
    errors: Vec<Option<&'a str>>,
    retryables: Vec<Option<bool>>,
    delays: Vec<Option<i64>>,
    progress: Vec<Option<&'a Value>>,
    backoff_base: i64,
    backoff_cap: i64,
}

impl<'a> FinishArgs<'a> {
    fn new(items: &[&'a (LeaseRef, Outcome)], terms: &crate::store::LeaseSettings) -> Self {
        let n = items.len();
        let mut args = Self {
            ids: Vec::with_capacity(n),
            leases: Vec::with_capacity(n),
            actions: Vec::with_capacity(n),
            results: Vec::with_capacity(n),
            errors: Vec::with_capacity(n),
            retryables: Vec::with_capacity(n),
            delays: Vec::with_capacity(n),
            progress: Vec::with_capacity(n),
            backoff_base: ms(terms.backoff_base),
            backoff_cap: ms(terms.backoff_cap),
        };
        // The items in (job, lease) order, each (job, lease) once: its
        // first item (a stable sort keeps the items' own order among
        // equals). The statement locks its rows in the order it is given
        // them, so this order is its lock order.
        let mut sorted: Vec<&(LeaseRef, Outcome)> = items.to_vec();
        sorted.sort_by_key(|(lease, _)| (lease.job_id.0, lease.run_lease.0));
        sorted.dedup_by_key(|(lease, _)| (lease.job_id.0, lease.run_lease.0));
        for (lease, outcome) in sorted {
            args.ids.push(lease.job_id.0);
            args.leases.push(lease.run_lease.0);
            args.actions.push(outcome.action().as_str());
            let (result, error, retryable, delay, checkpoint) = match outcome {
                Outcome::Complete { result } => (Some(result), None, None, None, None),
                Outcome::Fail {
                    error,
                    retryable,
                    retry_after_ms,
                } => (
                    None,
                    Some(error.as_str()),
                    Some(*retryable),
                    *retry_after_ms,
                    None,
                ),
                Outcome::Release { progress, delay_ms } => (None, None, None, *delay_ms, progress.as_ref()),
            };
            args.results.push(result);
            args.errors.push(error);
            args.retryables.push(retryable);
            args.delays.push(delay);
            args.progress.push(checkpoint);
        }
        args
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 10] {
        [
            &self.ids,
            &self.leases,
            &self.actions,
            &self.results,
            &self.errors,
            &self.retryables,
            &self.delays,
            &self.progress,
            &self.backoff_base,
            &self.backoff_cap,
        ]
    }
}

/// What `lease_finish.sql` applied: (job, lease) → (the outcome that took
/// effect, what it left).
type Applied = HashMap<(Uuid, i64), (FinishAction, Finished)>;

/// What the items of a finish made claimable, when the claims of its
/// transaction can still start at the claim floors: the queue and place
/// of each job queued again. `None` when they cannot: a job made
/// claimable whose place is not known here (a dead-letter follow-up, a
/// settled dependent).
fn requeued(
    rows: &[tokio_postgres::Row],
    settled: &[dependencies::Settled],
) -> Result<Option<Requeued>, StoreError> {
    if !settled.is_empty() {
        return Ok(None);
    }
    let mut requeued = Vec::new();
    for row in rows {
        if DeadLetter::from_row(row)?.is_some() {
            return Ok(None);
        }
        if let Some(key) = requeued_key(row, col::<DbJobState>(row, "state")?.0)? {
            requeued.push((col::<String>(row, "queue")?, key));
        }
    }
    Ok(Some(requeued))
}

/// A `lease_finish.sql` row's place in the claim order when the finish
/// queued its job again (`state` is the row's).
fn requeued_key(row: &tokio_postgres::Row, state: JobState) -> Result<Option<ClaimKey>, StoreError> {
    if state != JobState::Queued {
        return Ok(None);
    }
    Ok(Some(ClaimKey {
        priority: col(row, "priority")?,
        run_at: col(row, "run_at")?,
        id: col(row, "id")?,
    }))
}

/// Reads the rows of `lease_finish.sql`.
fn applied_rows(rows: &[tokio_postgres::Row]) -> Result<Applied, StoreError> {
    let mut applied = HashMap::with_capacity(rows.len());
    for row in rows {
        let action: String = col(row, "action")?;
        let action: FinishAction = action
            .parse()
            .map_err(|e: runlease_protocol::worker::UnknownAction| StoreError::Database(e.to_string()))?;
        let finished = Finished::from_row(row, true)?;
        applied.insert((finished.job_id.0, col(row, "run_lease")?), (action, finished));
    }
    Ok(applied)
}

/// Answers each item in order from what the finish applied; the items no
/// guard matched (repeats of an applied outcome, or stale) are read once
/// more on `client`.
async fn endings(
    client: &deadpool_postgres::ClientWrapper,
    items: &[&(LeaseRef, Outcome)],
    applied: Applied,
) -> Result<Vec<Ending>, StoreError> {
    // Items no guard matched: repeats of an applied outcome, or stale.
    let missed: Vec<&(LeaseRef, Outcome)> = items
        .iter()
        .copied()
        .filter(|(l, _)| !applied.contains_key(&(l.job_id.0, l.run_lease.0)))
        .collect();
    let mut now: HashMap<(Uuid, i64), (Finished, Option<Ended>)> = HashMap::new();
    if !missed.is_empty() {
        let ids: Vec<Uuid> = missed.iter().map(|(l, _)| l.job_id.0).collect();
        let leases: Vec<i64> = missed.iter().map(|(l, _)| l.run_lease.0).collect();
        let stmt = client.prepare_cached(sql::LEASE_FINISH_MISSED).await?;
        for row in client.query(&stmt, &[&ids, &leases]).await? {
            let outcome: Option<DbOutcome> = col(&row, "outcome")?;
            let worker: Option<String> = col(&row, "worker_id")?;
            let ended = outcome.map(|o| o.0).zip(worker);
            let finished = Finished::from_row(&row, false)?;
            now.insert((finished.job_id.0, col(&row, "run_lease")?), (finished, ended));
        }
    }

    // Each (job, lease) is applied by at most one item: the first.
    // A repeat of its kind in the same batch is a repeat (200, not
    // counted twice); another kind is stale.
    let mut answered_first: HashSet<(Uuid, i64)> = HashSet::new();
    Ok(items
        .iter()
        .map(|(lease, outcome)| {
            let key = (lease.job_id.0, lease.run_lease.0);
            if let Some((action, finished)) = applied.get(&key) {
                if *action != outcome.action() {
                    return Ending::Lost(Some(finished.state));
                }
                return Ending::Applied(Finished {
                    first: answered_first.insert(key),
                    ..finished.clone()
                });
            }
            match now.get(&key) {
                Some((finished, ended)) if is_repeat(ended.as_ref(), lease, outcome) => {
                    Ending::Applied(finished.clone())
                }
                Some((finished, _)) => Ending::Lost(Some(finished.state)),
                None => Ending::Lost(None),
            }
        })
        .collect())
}

impl Store {
    /// Ends attempts of every kind in one guarded statement (rows locked in
    /// id order; a database error applies none and fails every item). Each
    /// item is answered in order: [`Ending::Applied`] (with `first: false`
    /// when it repeats an outcome that already took effect under the same
    /// lease and worker) or [`Ending::Lost`] with where the job is now. Only
    /// items the statement did not match cost a second read.
    ///
    /// It runs in a transaction opened like a claim's (`Open::Claims`),
    /// as when claims ride it: its generic plan is the nested loop over the
    /// items in id order, so it locks its rows in that order whatever the
    /// table's size (ADR 022); the tallies of what it ended are written
    /// with its commit.
    pub async fn finish(&self, items: &[&(LeaseRef, Outcome)]) -> Result<Vec<Ending>, StoreError> {
        Ok(self.write_leases("finish", items, &[], &[]).await?.0)
    }

    /// [`Store::finish`] of `items` and, in the same transaction, after
    /// them, a claim for each of `claims` (shared queues only, as the first
    /// statement of [`Store::claim`]). Answers the items' endings and each
    /// claim's leases (with the slot, 0-based, each filled), or an error
    /// for all: nothing of a transaction that failed stands (an error in
    /// reading the claims' rows, once it committed, excepted: see
    /// [`Store::write_leases`]). A claim sees what the items before it
    /// made claimable.
    pub async fn finish_then_claim(
        &self,
        items: &[&(LeaseRef, Outcome)],
        claims: &[ClaimGroup<'_>],
    ) -> Result<(Vec<Ending>, Vec<Vec<(usize, ClaimedJob)>>), StoreError> {
        let (endings, claimed, _) = self.write_leases("finish", items, claims, &[]).await?;
        Ok((endings, claimed))
    }

    /// [`Store::finish_then_claim`] where `limited[i]` names the queues of
    /// `claims[i]` that take the limited path: after the shared statement,
    /// each of them is claimed on the slots still free as
    /// [`Store::claim`] does (its settings row locked, its limits admitted),
    /// in the same transaction. Also answers what the limits held back.
    pub async fn finish_then_claim_limited(
        &self,
        items: &[&(LeaseRef, Outcome)],
        claims: &[ClaimGroup<'_>],
        limited: &[Vec<QueueName>],
    ) -> Result<FinishedAndClaimed, StoreError> {
        self.write_leases("finish", items, claims, limited).await
    }

    /// The one transaction that ends attempts and claims leases: the items
    /// of [`Store::finish`], what ending them sets off (dead-letter
    /// follow-ups, dependents), then each of `claims` (timed and counted as
    /// `operation`). The claims come last, so they see everything the
    /// items made claimable (a job released by an item, a dependent an
    /// item's complete unblocked), as a claim made after the items' commit
    /// would; nothing is answered before the one commit of it all. It is
    /// opened with the claims' settings ([`Open::Claims`]), which give the
    /// claim its generic plan, planned once per connection instead of at
    /// every claim (planning cost about a third of a small claim), with the
    /// join methods that plan may use pinned to nested loops
    /// (lease_claim.sql says why). The claims go with the tallies and the
    /// COMMIT, in one round trip ([`Store::end_with_claims`]).
    pub(super) async fn write_leases(
        &self,
        operation: &'static str,
        items: &[&(LeaseRef, Outcome)],
        claims: &[ClaimGroup<'_>],
        limited: &[Vec<QueueName>],
    ) -> Result<FinishedAndClaimed, StoreError> {
        self.timed(operation, || async move {
            let client = self.conn().await?;
            let tx = Tallied::new(&client);
            let head = async {
                let (finished, settled) = self.begin_and_finish(&tx, items, !claims.is_empty()).await?;
                // A job the items made claimable was written after the
                // floors were read, and its wake-up comes after the commit:
                // the claims' floors must not pass it.
                let requeued = requeued(&finished, &settled)?;
                let send = self.prepare_claims(&tx, claims, requeued.as_deref()).await?;
                Ok::<_, StoreError>((finished, settled, send))
            };
            let (finished, settled, send) = tx.or_roll_back(head.await).await?;
            let (mut claimed, held_back, found) = self
                .end_with_claims(tx, &send, items.is_empty(), claims, limited, settled)
                .await?;
            let floors_read = (send.into_taken(), found);
            self.claims_committed(&client, claims, &mut claimed, floors_read)
                .await?;
            let answered = async {
                let applied = applied_rows(&finished)?;
                endings(&client, items, applied).await
            };
            match answered.await {
                Ok(endings) => Ok((endings, claimed, held_back)),
                Err(e) => {
                    // The claims committed, but the finish cannot be
                    // answered: their leases, never handed out, are given
                    // back.
                    self.release_claimed(claims, &claimed).await;
                    Err(e)
                }
            }
        })
        .await
    }

    /// The end of [`Store::write_leases`]: its claims (`send`; after BEGIN
    /// when `begin`), then the commit, after which the jobs `settled` are
    /// reported. Without limited queues the claims, the tallies and the
    /// COMMIT go in one round trip, the claims' rows read once it went
    /// through (one that cannot be read is answered as an error, its
    /// transaction standing, its leases left to expire); with them, each
    /// limited queue is claimed with the slots the shared statement left.
    async fn end_with_claims(
        &self,
        tx: Tallied<'_>,
        send: &ClaimSend<'_>,
        begin: bool,
        claims: &[ClaimGroup<'_>],
        limited: &[Vec<QueueName>],
        settled: Vec<dependencies::Settled>,
    ) -> Result<ClaimsEnded, StoreError> {
        if limited.iter().all(Vec::is_empty) {
            let rows = tx.commit_behind(send.send(&tx, begin)).await?;
            self.report_settled(settled);
            let (claimed, found) = rows.read()?;
            return Ok((claimed, Vec::new(), found));
        }
        let sent = async {
            let (mut claimed, found) = send.send(&tx, begin).await?.read()?;
            let held_back = self
                .claim_limited_groups(&tx, claims, limited, &mut claimed)
                .await?;
            Ok::<_, StoreError>((claimed, held_back, found))
        };
        let sent = sent.await;
        let (claimed, held_back, found) = tx.end(sent).await?;
        self.report_settled(settled);
        Ok((claimed, held_back, found))
    }

    /// The first part of [`Store::write_leases`]: BEGIN with the claims'
    /// settings (when there are items or `claims_follow`; BEGIN goes with
    /// the claims otherwise) and the items (sent together), so their rows
    /// are locked in id order before anything else (claims lock with SKIP
    /// LOCKED and never wait); then, only when a row needs them, the
    /// follow-ups of jobs failed for good and the dependents of jobs ended.
    async fn begin_and_finish(
        &self,
        tx: &Tallied<'_>,
        items: &[&(LeaseRef, Outcome)],
        claims_follow: bool,
    ) -> Result<(Vec<tokio_postgres::Row>, Vec<dependencies::Settled>), StoreError> {
        if items.is_empty() {
            if !claims_follow {
                tx.begin(Open::Claims).await?;
            }
            return Ok((Vec::new(), Vec::new()));
        }
        // Prepared first, so that BEGIN and the finish are sent at their
        // first poll below, in order.
        let finish = tx.prepare(&sql::LEASE_FINISH).await?;
        let args = FinishArgs::new(items, self.lease_settings());
        let params = args.params();
        let (begun, finished) = tokio::join!(tx.begin(Open::Claims), tx.run(&finish, &params));
        begun?;
        let finished = finished?;
        retry::enqueue_follow_ups(tx, &finished, self.lease_settings().default_max_attempts).await?;
        let settled = dependencies::settle(tx, dependencies::ended_by_finish(&finished)?).await?;
        Ok((finished, settled))
    }

    /// What follows the commit of claims, whichever transaction carried
    /// them: the claim floors learn what the reads after the claims found
    /// ([`crate::store::floors::ClaimFloors::found`]), and the leased jobs
    /// get their dependencies. Should those not be read, the leases, never
    /// handed out, are given back and the error answered.
    pub(super) async fn claims_committed(
        &self,
        client: &deadpool_postgres::ClientWrapper,
        claims: &[ClaimGroup<'_>],
        claimed: &mut [Vec<(usize, ClaimedJob)>],
        (taken, found): FloorsRead,
    ) -> Result<(), StoreError> {
        if let Some(floors) = self.claim_floors() {
            floors.found(&taken, &found);
        }
        let mut leased: Vec<&mut ClaimedJob> = claimed.iter_mut().flatten().map(|(_, j)| j).collect();
        if let Err(e) = dependencies::attach_to_leases(client, &mut leased).await {
            self.release_claimed(claims, claimed).await;
            return Err(e);
        }
        Ok(())
    }

    /// Gives back leases of [`Store::finish_then_claim`] that committed but
    /// are not answered.
    async fn release_claimed(&self, claims: &[ClaimGroup<'_>], claimed: &[Vec<(usize, ClaimedJob)>]) {
        let leases: Vec<LeaseRef> = claims
            .iter()
            .zip(claimed)
            .flat_map(|(group, rows)| {
                rows.iter().filter_map(|(slot, row)| {
                    Some(LeaseRef {
                        job_id: row.id,
                        run_lease: row.run_lease,
                        worker_id: (*group.slots.get(*slot)?).clone(),
                    })
                })
            })
            .collect();
        if !leases.is_empty() {
            tracing::warn!(
                leases = leases.len(),
                "a finish failed after its claims committed: releasing them"
            );
            self.give_back(leases).await;
        }
        // Claimable again, below what the reads after the claims saw: no
        // floor or empty mark of this coordinator may stand over them
        // (the claim loops find them on their re-check).
        if let Some(floors) = self.claim_floors() {
            for (_, row) in claimed.iter().flatten() {
                floors.wrote(row.queue.as_str(), None);
            }
        }
    }
}
