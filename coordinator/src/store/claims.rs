//! Claims: leases handed out by the claim statements, for unlimited
//! queues in one shared statement and for queues with flow-control limits
//! (running caps, rate limits, concurrency keys) in a transaction of their own.

use std::time::Duration;

use chrono::{DateTime, Utc};

use runlease_protocol::{JobState, QueueName, WorkerId};

use crate::flow;
use crate::store::floors::{ClaimKey, FloorParams, Found, Taken, found_rows};
use crate::store::jobs::Enqueued;
use crate::store::leases::{ClaimGroup, LeaseRef, Outcome};
use crate::store::queues::RateLimit;
use crate::store::rows::{ClaimedJob, col};
use crate::store::tally::{Open, Prepared, Tallied};
use crate::store::{Store, StoreError, dependencies, ms, sql};

/// What a claim handed out, and what held it back.
#[derive(Debug, Default)]
pub struct Claimed {
    /// Each lease with the slot (0-based) it filled, in slot order.
    pub rows: Vec<(usize, ClaimedJob)>,
    /// Slots a queue's limits held back, by queue and kind of limit.
    pub held_back: Vec<(QueueName, LimitKind, usize)>,
    /// When a rate-limited queue has its next token: a parked claim should
    /// look again then, not only at its re-check timer.
    pub retry_in: Option<Duration>,
}

/// The flow-control limits a claim can be held back by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LimitKind {
    /// The queue's `max_running`.
    MaxRunning,
    /// The queue's `max_running_per_key`.
    PerKey,
    /// The queue's rate limit.
    Rate,
}

impl LimitKind {
    /// The name in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::MaxRunning => "max_running",
            LimitKind::PerKey => "max_running_per_key",
            LimitKind::Rate => "rate_limit",
        }
    }
}

#[derive(Debug, Default)]
struct LimitedClaim {
    rows: Vec<(usize, ClaimedJob)>,
    held_back: Vec<(LimitKind, usize)>,
    retry_in: Option<Duration>,
}

/// A limited queue's `max_running_per_key` and its other limits, from its
/// locked settings row (`queue_limits_lock.sql`); `None` while it is paused.
fn limits_of(row: &tokio_postgres::Row) -> Result<Option<(Option<i32>, flow::Limits)>, StoreError> {
    if col::<bool>(row, "paused")? {
        return Ok(None);
    }
    let rate_limit = match (
        col::<Option<f64>>(row, "rate_per_s")?,
        col::<Option<i32>>(row, "rate_burst")?,
    ) {
        (Some(per_s), Some(burst)) => Some(RateLimit { per_s, burst }),
        _ => None,
    };
    let limits = flow::Limits {
        max_running: col(row, "max_running")?,
        rate_limit,
        tokens: col(row, "rate_tokens")?,
        refilled_at: col(row, "rate_refilled_at")?,
    };
    Ok(Some((col(row, "max_running_per_key")?, limits)))
}

/// Reads claim rows: each job with the slot (0-based) it filled.
pub(super) fn slotted(rows: &[tokio_postgres::Row]) -> Result<Vec<(usize, ClaimedJob)>, StoreError> {
    rows.iter()
        .map(|row| {
            let slot: i64 = col(row, "slot")?;
            Ok((usize::try_from(slot - 1).unwrap_or(0), ClaimedJob::from_row(row)?))
        })
        .collect()
}

/// The queues one claim statement scans, each from its floor (`floors`:
/// one per queue, in order, or none: every scan from its queue's first
/// entry).
#[derive(Clone, Copy)]
pub(super) struct Scan<'a> {
    pub queues: &'a [&'a str],
    pub floors: &'a [&'a Taken],
}

/// Runs `lease_claim.sql` (`claim`, prepared on `tx`) in `tx`, answering
/// its rows as PostgreSQL sent them ([`slotted`] reads them); `limited` is
/// the claim time of the limited path (which serves limited queues), `None`
/// for the shared statement.
async fn claim_statement(
    tx: &Tallied<'_>,
    claim: &Prepared,
    scan: Scan<'_>,
    slots: &[&WorkerId],
    time_left_ms: Option<u64>,
    leases: &crate::store::LeaseSettings,
    limited: Option<DateTime<Utc>>,
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    let serve_limited = limited.is_some();
    let workers: Vec<&str> = slots.iter().map(|w| w.as_str()).collect();
    let time_left = time_left_ms.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
    let floors = FloorParams::of(scan.floors);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 10] = [
        &scan.queues,
        &workers,
        &ms(leases.ttl),
        &ms(leases.default_timeout),
        &time_left,
        &serve_limited,
        &limited,
        &floors.priority,
        &floors.run_at,
        &floors.id,
    ];
    tx.run(claim, &params).await
}

/// The claim floors a transaction's claims took, and what it read after
/// them (see [`crate::store::floors::ClaimFloors::found`]).
pub(super) type FloorsRead = (Vec<Taken>, Vec<Found>);

/// Jobs a transaction queued again before its claims, by queue and place
/// in the claim order.
pub type Requeued = Vec<(String, ClaimKey)>;

/// The jobs an enqueue created `queued`, by queue and place in the claim
/// order.
pub(super) fn queued_by(answers: &[Enqueued]) -> Requeued {
    answers
        .iter()
        .filter(|e| e.created && e.job.state == JobState::Queued)
        .map(|e| {
            let key = ClaimKey {
                priority: e.job.priority,
                run_at: e.job.run_at,
                id: e.job.id.0,
            };
            (e.job.queue.to_string(), key)
        })
        .collect()
}

/// Each claim group's leases, with the slot (0-based) each filled.
pub(super) type GroupLeases = Vec<Vec<(usize, ClaimedJob)>>;

/// What the claims of a transaction answered ([`ClaimSend::send`]): each
/// group's rows, and the floor read's.
#[derive(Default)]
pub(super) struct ClaimRows {
    claims: Vec<Vec<tokio_postgres::Row>>,
    found: Vec<tokio_postgres::Row>,
}

impl ClaimRows {
    /// Each group's leases (with the slot, 0-based, each filled) and what
    /// the floor read found.
    pub(super) fn read(&self) -> Result<(GroupLeases, Vec<Found>), StoreError> {
        let claimed = self
            .claims
            .iter()
            .map(|rows| slotted(rows))
            .collect::<Result<_, _>>()?;
        Ok((claimed, found_rows(&self.found)?))
    }
}

/// The claims of a transaction, prepared ([`Store::prepare_claims`]).
pub(super) struct ClaimSend<'a> {
    claims: &'a [ClaimGroup<'a>],
    claim: Option<Prepared>,
    read: Option<tokio_postgres::Statement>,
    names: Vec<Vec<&'a str>>,
    taken: Vec<Vec<Taken>>,
    terms: &'a crate::store::LeaseSettings,
}

impl ClaimSend<'_> {
    /// Sends the claims (after BEGIN with the claims' settings when
    /// `begin`, else after the settings of their scans), one statement per
    /// group, and the read of the floors after them: all at its first poll,
    /// in that order, so that a statement the caller polls after it (the
    /// COMMIT: [`Tallied::commit_behind`]) goes behind them in the same
    /// round trip. Answers the rows of each group's statement and of the
    /// read, as PostgreSQL sent them ([`ClaimRows::read`] reads them).
    pub(super) async fn send(&self, tx: &Tallied<'_>, begin: bool) -> Result<ClaimRows, StoreError> {
        let Some(claim) = &self.claim else {
            return Ok(ClaimRows::default());
        };
        let floors_of: Vec<Vec<&Taken>> = self.taken.iter().map(|t| t.iter().collect()).collect();
        // The queues read after the claims, each once.
        let mut reads: Vec<&Taken> = Vec::new();
        for t in self.taken.iter().flatten().filter(|t| t.reads_after()) {
            if !reads.iter().any(|r| r.queue == t.queue) {
                reads.push(t);
            }
        }
        let claiming =
            futures_util::future::join_all(self.claims.iter().zip(&self.names).zip(&floors_of).map(
                |((c, names), floors)| {
                    let scan = Scan {
                        queues: names,
                        floors,
                    };
                    claim_statement(tx, claim, scan, &c.slots, c.time_left_ms, self.terms, None)
                },
            ));
        // Sent after the claims (statements sent together run in the order
        // they were first polled), so the jobs they claimed are not read.
        let reading = async {
            let Some(stmt) = &self.read else {
                return Ok(Vec::new());
            };
            let queues: Vec<&str> = reads.iter().map(|t| t.queue.as_str()).collect();
            let floors = FloorParams::of(&reads);
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [&queues, &floors.priority, &floors.run_at, &floors.id];
            tx.read(stmt, &params).await
        };
        let begun = async {
            if begin {
                tx.begin(Open::Claims).await
            } else {
                Ok(())
            }
        };
        // Sent after BEGIN and before the claims (each future sends at its
        // first poll, in this order).
        let planned = tx.set(sql::CLAIM_SCAN_PLANNING);
        let (begun, planned, claimed, found) = tokio::join!(begun, planned, claiming, reading);
        begun?;
        planned?;
        Ok(ClaimRows {
            claims: claimed.into_iter().collect::<Result<_, _>>()?,
            found: found?,
        })
    }

    /// The floors the claims took.
    pub(super) fn into_taken(self) -> Vec<Taken> {
        self.taken.into_iter().flatten().collect()
    }
}

impl Store {
    /// Everything the claims of a transaction need before they are sent:
    /// their statements prepared, and with `floored` (the jobs the
    /// transaction queued again before them) the floors taken, each
    /// queue's scan starting at its claim floor or at the first of those
    /// jobs below it; the first claimable job of each queue is then read
    /// after the claims, answered with the floors taken for
    /// [`crate::store::floors::ClaimFloors::found`] once the transaction
    /// has committed.
    pub(super) async fn prepare_claims<'a>(
        &'a self,
        tx: &Tallied<'_>,
        claims: &'a [ClaimGroup<'a>],
        floored: Option<&[(String, ClaimKey)]>,
    ) -> Result<ClaimSend<'a>, StoreError> {
        let claim = if claims.is_empty() {
            None
        } else {
            Some(tx.prepare(&sql::LEASE_CLAIM).await?)
        };
        let names: Vec<Vec<&str>> = claims
            .iter()
            .map(|c| c.queues.iter().map(QueueName::as_str).collect())
            .collect();
        let mut taken: Vec<Vec<Taken>> = match (self.claim_floors(), floored) {
            (Some(floors), Some(_)) => names.iter().map(|n| floors.take(n)).collect(),
            _ => vec![Vec::new(); claims.len()],
        };
        for (queue, key) in floored.unwrap_or_default() {
            for t in taken.iter_mut().flatten().filter(|t| t.queue == *queue) {
                t.floor = t.floor.map(|floor| floor.min(*key));
            }
        }
        let read = if taken.iter().flatten().any(Taken::reads_after) {
            Some(tx.client().prepare_cached(sql::LEASE_CLAIM_FLOOR).await?)
        } else {
            None
        };
        Ok(ClaimSend {
            claims,
            claim,
            read,
            names,
            taken,
            terms: self.lease_settings(),
        })
    }

    /// Claims up to one lease per slot (each slot names its worker) from
    /// `queues`, answering each lease with the slot (0-based) it filled,
    /// in slot order. Queues without limits share one statement; each of
    /// `limited` (queues this coordinator knows to have flow-control limits)
    /// is then served, with the slots left, by the limited path.
    pub async fn claim(
        &self,
        queues: &[QueueName],
        slots: &[&WorkerId],
        time_left_ms: Option<u64>,
        limited: &[QueueName],
    ) -> Result<Claimed, StoreError> {
        // The shared statement: the lease transaction with no items to
        // write before its claim (see `write_leases`).
        let group = ClaimGroup {
            queues,
            slots: slots.to_vec(),
            time_left_ms,
        };
        // Queues that all take the limited path have nothing for the shared
        // statement (it skips them): no transaction of its own for it.
        let mut claimed = if !limited.is_empty() && queues.iter().all(|q| limited.contains(q)) {
            Vec::new()
        } else {
            let (_, mut groups, _) = self
                .write_leases("claim", &[], std::slice::from_ref(&group), &[])
                .await?;
            groups.pop().unwrap_or_default()
        };
        let mut answer = Claimed::default();
        for queue in limited.iter().filter(|q| queues.contains(q)) {
            let taken: Vec<usize> = claimed.iter().map(|(slot, _)| *slot).collect();
            let free: Vec<usize> = (0..slots.len()).filter(|i| !taken.contains(i)).collect();
            if free.is_empty() {
                break;
            }
            let free_slots: Vec<&WorkerId> = free.iter().map(|&i| slots[i]).collect();
            let limited = match self
                .timed("claim", || self.claim_limited(queue, &free_slots, time_left_ms))
                .await
            {
                Ok(limited) => limited,
                // Leases already committed (the shared statement, or other
                // limited queues) are answered: dropping them would leave
                // their jobs running with no holder until they expire.
                Err(e) if !claimed.is_empty() => {
                    tracing::warn!(%queue, error = %e, "the limited claim failed; answering the leases already claimed");
                    break;
                }
                Err(e) => return Err(e),
            };
            for (slot, row) in limited.rows {
                claimed.push((free[slot], row));
            }
            answer.held_back.extend(
                limited
                    .held_back
                    .into_iter()
                    .map(|(kind, n)| (queue.clone(), kind, n)),
            );
            answer.retry_in = match (answer.retry_in, limited.retry_in) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        claimed.sort_by_key(|(slot, _)| *slot);
        // The limited path's leases (the shared statement's have theirs).
        let mut leased: Vec<&mut ClaimedJob> = claimed.iter_mut().map(|(_, j)| j).collect();
        if leased
            .iter()
            .any(|j| j.has_dependencies && j.dependencies.is_empty())
        {
            let client = self.conn().await?;
            dependencies::attach_to_leases(&client, &mut leased).await?;
        }
        answer.rows = claimed;
        Ok(answer)
    }

    /// The limited path: one queue, its settings row locked for the whole
    /// transaction (claims of a limited queue run one at a time, on every
    /// coordinator), the running jobs counted after the lock, at most what
    /// `max_running` and the rate limit's tokens allow started, per-key
    /// limits applied by the keyed statement, the bucket charged.
    async fn claim_limited(
        &self,
        queue: &QueueName,
        slots: &[&WorkerId],
        time_left_ms: Option<u64>,
    ) -> Result<LimitedClaim, StoreError> {
        let client = self.conn().await?;
        let tx = Tallied::new(&client);
        let outcome = async {
            tx.begin(Open::States).await?;
            self.claim_limited_in(&tx, queue, slots, time_left_ms).await
        }
        .await;
        tx.end(outcome).await
    }

    /// [`Store::claim_limited`] in `tx`.
    async fn claim_limited_in(
        &self,
        tx: &Tallied<'_>,
        queue: &QueueName,
        slots: &[&WorkerId],
        time_left_ms: Option<u64>,
    ) -> Result<LimitedClaim, StoreError> {
        let client = tx.client();
        let mut outcome = LimitedClaim::default();
        let stmt = client.prepare_cached(sql::QUEUE_LIMITS_LOCK).await?;
        let Some(limits) = client.query_opt(&stmt, &[&queue.as_str()]).await? else {
            // No settings (any more): no limits; the shared statement serves it.
            return Ok(outcome);
        };
        let Some((per_key, limits)) = limits_of(&limits)? else {
            // Paused: nothing starts.
            return Ok(outcome);
        };
        let stmt = client.prepare_cached(sql::QUEUE_RUNNING_COUNT).await?;
        let count = client.query_one(&stmt, &[&queue.as_str()]).await?;
        let at: DateTime<Utc> = col(&count, "at")?;
        let admission = flow::admit(&limits, slots.len(), col(&count, "running")?, at);
        outcome.held_back = admission.held_back;
        outcome.retry_in = admission.retry_in;
        if admission.allowed == 0 {
            return Ok(outcome);
        }
        let admitted = &slots[..admission.allowed.min(slots.len())];
        let rows = match per_key {
            None => {
                // Planned as the shared claim is (lease_claim.sql), the
                // scan's settings undone after it (a keyed claim of another
                // queue may follow in this transaction).
                client.batch_execute(sql::CLAIM_PLANNING).await?;
                let claim = tx.prepare(&sql::LEASE_CLAIM).await?;
                let terms = self.lease_settings();
                let scan = Scan {
                    queues: &[queue.as_str()],
                    floors: &[],
                };
                let (on, rows, off) = tokio::join!(
                    client.batch_execute(sql::CLAIM_SCAN_PLANNING),
                    claim_statement(tx, &claim, scan, admitted, time_left_ms, terms, Some(at)),
                    client.batch_execute(sql::CLAIM_SCAN_PLANNING_RESET),
                );
                on?;
                off?;
                slotted(&rows?)?
            }
            Some(per_key) => {
                let rows = self
                    .claim_keyed(tx, queue, admitted, time_left_ms, per_key, at)
                    .await?;
                if rows.len() < admitted.len() {
                    // Fewer than the other limits allow: keys at their limit
                    // (or simply no more due jobs).
                    outcome.held_back.push((LimitKind::PerKey, 0));
                }
                rows
            }
        };
        if let Some(tokens) = admission.tokens {
            let left = (tokens - rows.len() as f64).max(0.0);
            let stmt = client.prepare_cached(sql::QUEUE_RATE_TAKE).await?;
            client.execute(&stmt, &[&queue.as_str(), &left, &at]).await?;
        }
        outcome.rows = rows;
        Ok(outcome)
    }

    /// The claim of a queue with `max_running_per_key` (`lease_claim_keyed.sql`),
    /// in the limited path's transaction: one lease per slot at most, no key
    /// past `per_key` running jobs.
    async fn claim_keyed(
        &self,
        tx: &Tallied<'_>,
        queue: &QueueName,
        slots: &[&WorkerId],
        time_left_ms: Option<u64>,
        per_key: i32,
        at: DateTime<Utc>,
    ) -> Result<Vec<(usize, ClaimedJob)>, StoreError> {
        let workers: Vec<&str> = slots.iter().map(|w| w.as_str()).collect();
        let time_left = time_left_ms.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        let terms = self.lease_settings();
        let allowed = i32::try_from(slots.len()).unwrap_or(i32::MAX);
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 8] = [
            &queue.as_str(),
            &workers,
            &ms(terms.ttl),
            &ms(terms.default_timeout),
            &time_left,
            &per_key,
            &allowed,
            &at,
        ];
        slotted(&tx.query(&sql::LEASE_CLAIM_KEYED, &params).await?)
    }

    /// The limited path of each claim whose queues `limited` names (the
    /// limited ones of `claims[i]` in `limited[i]`), in `tx` after the
    /// shared statement: queue by queue, on the slots still free, as
    /// [`Store::claim`] does in transactions of their own. Each claim's
    /// leases stay in slot order. Answers what the limits held back.
    pub(super) async fn claim_limited_groups(
        &self,
        tx: &Tallied<'_>,
        claims: &[ClaimGroup<'_>],
        limited: &[Vec<QueueName>],
        claimed: &mut [Vec<(usize, ClaimedJob)>],
    ) -> Result<Vec<(QueueName, LimitKind, usize)>, StoreError> {
        let mut held_back = Vec::new();
        if limited.iter().all(Vec::is_empty) {
            return Ok(held_back);
        }
        // Planned as in a transaction of its own (the keyed claim with the
        // server's settings; the plain one sets the claim's again).
        tx.client().batch_execute(sql::CLAIM_PLANNING_RESET).await?;
        for ((group, queues), rows) in claims.iter().zip(limited).zip(claimed.iter_mut()) {
            for queue in queues.iter().filter(|q| group.queues.contains(q)) {
                let free: Vec<usize> = (0..group.slots.len())
                    .filter(|i| !rows.iter().any(|(slot, _)| slot == i))
                    .collect();
                if free.is_empty() {
                    break;
                }
                let free_slots: Vec<&WorkerId> = free.iter().map(|&i| group.slots[i]).collect();
                let got = self
                    .claim_limited_in(tx, queue, &free_slots, group.time_left_ms)
                    .await?;
                rows.extend(got.rows.into_iter().map(|(slot, row)| (free[slot], row)));
                held_back.extend(
                    got.held_back
                        .into_iter()
                        .map(|(kind, n)| (queue.clone(), kind, n)),
                );
            }
            rows.sort_by_key(|(slot, _)| *slot);
        }
        Ok(held_back)
    }

    /// Releases leases that were claimed but never handed out (no attempt
    /// charged); where that fails, they expire.
    pub async fn give_back(&self, leases: Vec<LeaseRef>) {
        let items: Vec<(LeaseRef, Outcome)> = leases
            .into_iter()
            .map(|lease| {
                (
                    lease,
                    Outcome::Release {
                        progress: None,
                        delay_ms: None,
                    },
                )
            })
            .collect();
        let refs: Vec<&(LeaseRef, Outcome)> = items.iter().collect();
        if let Err(e) = self.finish(&refs).await {
            tracing::warn!(error = %e, leases = refs.len(), "could not release leases never handed out; they will expire");
        }
    }
}
