//! The tallies as values. `job_tallies` keeps per queue the terminal totals
//! (done, failed, cancelled) and two attempt totals (lease expiries,
//! retries), so the figures never count the history. Every statement that
//! moves jobs in or out of a terminal state, deletes jobs, or writes
//! attempts that count is a [`Changes`]: its SQL together with what each
//! row it answers does to the tallies. A `Changes` runs only in a
//! [`Tallied`] transaction, which sums the [`Delta`]s of what it ran and
//! writes them in the round trip that commits it. A statement declared
//! without its delta does not compile; a plain statement that changes
//! states is caught by `every_statement_that_changes_states_is_tallied`.
//!
//! The transaction is marked (`runlease.tallies` and its siblings, set
//! local, so the marks hold behind a pooler in transaction mode) so that
//! the database's fallback, which asks for a recount when `state` changes
//! or jobs are deleted outside the coordinator, leaves it alone.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8};

use deadpool_postgres::ClientWrapper;
use futures_util::TryStreamExt;
use runlease_protocol::JobState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Column, Row};

use crate::store::StoreError;
use crate::store::rows::{DbJobState, col};

mod behind;

/// One counter of `job_tallies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tally {
    /// Jobs done.
    Done,
    /// Jobs failed for good.
    Failed,
    /// Jobs cancelled.
    Cancelled,
    /// Attempts ended by the reaper.
    LeaseExpiries,
    /// Attempts that failed and queued their job again.
    Retries,
}

impl Tally {
    /// The name `job_tallies.tally` stores.
    pub fn as_str(self) -> &'static str {
        match self {
            Tally::Done => "done",
            Tally::Failed => "failed",
            Tally::Cancelled => "cancelled",
            Tally::LeaseExpiries => "lease_expiries",
            Tally::Retries => "retries",
        }
    }

    /// The terminal tally a job in `state` is counted in, if any.
    pub fn terminal(state: JobState) -> Option<Tally> {
        match state {
            JobState::Done => Some(Tally::Done),
            JobState::Failed => Some(Tally::Failed),
            JobState::Cancelled => Some(Tally::Cancelled),
            JobState::Blocked | JobState::Queued | JobState::Running | JobState::EnqueueFailed => None,
        }
    }
}

/// What one transaction changes in the tallies, per queue and tally.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Delta(BTreeMap<(String, Tally), i64>);

impl Delta {
    /// Adds `n` to `tally` of `queue`.
    pub fn add(&mut self, queue: &str, tally: Tally, n: i64) {
        let entry = self.0.entry((queue.to_owned(), tally)).or_default();
        *entry += n;
        if *entry == 0 {
            self.0.remove(&(queue.to_owned(), tally));
        }
    }

    /// A job of `queue` that is now in `state`, and was not terminal before.
    pub fn entered(&mut self, queue: &str, state: JobState) {
        if let Some(tally) = Tally::terminal(state) {
            self.add(queue, tally, 1);
        }
    }

    /// A job of `queue` that left `state` (deleted, or retried by an admin).
    pub fn left(&mut self, queue: &str, state: JobState) {
        if let Some(tally) = Tally::terminal(state) {
            self.add(queue, tally, -1);
        }
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The count of `tally` of `queue` it adds.
    pub fn get(&self, queue: &str, tally: Tally) -> i64 {
        self.0.get(&(queue.to_owned(), tally)).copied().unwrap_or(0)
    }

    fn merge(&mut self, other: Delta) {
        for ((queue, tally), n) in other.0 {
            self.add(&queue, tally, n);
        }
    }

    /// The parallel arrays `job_tally_add.sql` takes.
    fn columns(&self) -> (Vec<&str>, Vec<&str>, Vec<i64>) {
        let mut queues = Vec::with_capacity(self.0.len());
        let mut tallies = Vec::with_capacity(self.0.len());
        let mut counts = Vec::with_capacity(self.0.len());
        for ((queue, tally), n) in &self.0 {
            queues.push(queue.as_str());
            tallies.push(tally.as_str());
            counts.push(*n);
        }
        (queues, tallies, counts)
    }
}

/// What one answered row of a [`Changes`] does to the tallies.
pub type RowDelta = fn(&Row, &mut Delta) -> Result<(), StoreError>;

/// A statement that changes job states or deletes jobs, with what each row
/// it answers does to the tallies. Runs only through [`Tallied::query`].
pub struct Changes {
    sql: &'static str,
    delta: RowDelta,
    tallies: bool,
}

impl Changes {
    /// `sql` whose answered rows change the tallies as `delta` says.
    pub const fn new(sql: &'static str, delta: RowDelta) -> Self {
        Self {
            sql,
            delta,
            tallies: true,
        }
    }

    /// `sql` that changes states but none in or out of a terminal state,
    /// and writes no attempt (claims, the enqueue_failed mark and its
    /// repair, a dead letter's follow-up): it changes no tally, so it may
    /// be sent with the COMMIT ([`Tallied::commit_behind`]).
    pub const fn untallied(sql: &'static str) -> Self {
        Self {
            sql,
            delta: no_tally,
            tallies: false,
        }
    }

    /// The statement's text.
    pub const fn sql(&self) -> &'static str {
        self.sql
    }
}

/// A [`Changes`] prepared on a [`Tallied`] transaction's connection.
pub struct Prepared {
    statement: tokio_postgres::Statement,
    delta: RowDelta,
    tallies: bool,
}

/// The delta of an [`Changes::untallied`] statement.
fn no_tally(_: &Row, _: &mut Delta) -> Result<(), StoreError> {
    Ok(())
}

/// A row answered with the job's `queue` and its new `state`.
pub fn entered(row: &Row, delta: &mut Delta) -> Result<(), StoreError> {
    let queue: &str = col(row, "queue")?;
    let state: DbJobState = col(row, "state")?;
    delta.entered(queue, state.0);
    Ok(())
}

/// A row answered with the deleted job's `queue` and the `state` it had.
pub fn deleted(row: &Row, delta: &mut Delta) -> Result<(), StoreError> {
    let queue: &str = col(row, "queue")?;
    let state: DbJobState = col(row, "state")?;
    delta.left(queue, state.0);
    Ok(())
}

/// A row answered with the retried job's `queue` and `state_before`, the
/// terminal state an admin retry took it out of.
pub fn retried(row: &Row, delta: &mut Delta) -> Result<(), StoreError> {
    let queue: &str = col(row, "queue")?;
    let state: DbJobState = col(row, "state_before")?;
    delta.left(queue, state.0);
    Ok(())
}

/// A finished attempt (`lease_finish.sql`): the job's terminal state, and a
/// retry where a fail queued the job again. Its rows of settled dependents
/// (action `dependency`) count the state each entered: `cancelled` counts,
/// `queued` (from `blocked`) and `blocked` do not.
pub fn finished(row: &Row, delta: &mut Delta) -> Result<(), StoreError> {
    entered(row, delta)?;
    let action: &str = col(row, "action")?;
    let state: DbJobState = col(row, "state")?;
    if action == "fail" && state.0 == JobState::Queued {
        delta.add(col(row, "queue")?, Tally::Retries, 1);
    }
    Ok(())
}

/// A reaped attempt (`lease_reap.sql`): a lease expiry, the job's terminal
/// state, and a retry where the job was queued again.
pub fn reaped(row: &Row, delta: &mut Delta) -> Result<(), StoreError> {
    entered(row, delta)?;
    let queue: &str = col(row, "queue")?;
    delta.add(queue, Tally::LeaseExpiries, 1);
    let state: DbJobState = col(row, "state")?;
    if state.0 == JobState::Queued {
        delta.add(queue, Tally::Retries, 1);
    }
    Ok(())
}

/// How a [`Tallied`] transaction is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Statements that change states.
    States,
    /// Inserts of jobs without dependencies (`job_enqueue.sql`): a generic
    /// plan, made once per connection. The insert reads no table by its
    /// parameters (its one lookup, of the queue's settings, is per row
    /// whatever the batch), so its generic plan is the one a custom plan
    /// would make; left to choose, PostgreSQL plans a batch of a few jobs
    /// again for every execution, since the generic plan's guess of ten
    /// rows from each array costs more than the few it is given.
    Inserts,
    /// Claims too: their generic plan, nested loops only (`lease_claim.sql`).
    Claims,
    /// Deletes of jobs too (`job_prune.sql`, `job_delete.sql`), which take
    /// their attempts with them.
    Deletes,
}

/// The marks of a transaction whose tallies the store writes: the
/// database's fallback (a recount asked for when `state` changes, attempts
/// counted by a trigger) leaves it alone.
macro_rules! marks {
    () => {
        "BEGIN; SET LOCAL runlease.tallies = 'explicit'; SET LOCAL runlease.attempt_tallies = 'explicit'"
    };
}

impl Open {
    /// BEGIN and the marks, one simple-query string.
    pub fn sql(self) -> &'static str {
        match self {
            Open::States => marks!(),
            Open::Inserts => concat!(marks!(), "; SET LOCAL plan_cache_mode = force_generic_plan"),
            Open::Claims => concat!(marks!(), "; ", claim_planning!()),
            // Deletes have marks of their own: a coordinator of schema
            // version 7 deleted in marked transactions without writing
            // deltas (migration 8), and one of version 8 counted on the
            // foreign key's cascade to delete attempts (migration 9).
            Open::Deletes => concat!(
                marks!(),
                "; SET LOCAL runlease.tally_deletes = 'explicit'; SET LOCAL runlease.job_deletes = 'explicit'"
            ),
        }
    }
}

/// Adds tally deltas: $1 text[] queues, $2 text[] tallies, $3 bigint[] counts.
pub const JOB_TALLY_ADD: &str = include_str!("sql/job_tally_add.sql");

/// A transaction on one pooled connection that writes the tallies of what
/// it ran with its COMMIT. Its parts may be sent together (pipelined):
/// [`Tallied::begin`] first, then statements; then [`Tallied::end`], which
/// commits (the deltas and the COMMIT in one round trip) or rolls back, or
/// [`Tallied::commit_behind`], which sends its last statements (ones that
/// change no tally) in that same round trip.
pub struct Tallied<'c> {
    client: &'c ClientWrapper,
    delta: Mutex<Delta>,
    /// How far [`Tallied::commit_behind`] has gone: which statements may
    /// still be sent.
    stage: AtomicU8,
    /// A statement failed or was refused while the last ones were being
    /// sent: the transaction rolls back.
    refused: AtomicBool,
}

impl<'c> Tallied<'c> {
    /// A transaction on `client`, not yet begun.
    pub fn new(client: &'c ClientWrapper) -> Self {
        Self {
            client,
            delta: Mutex::default(),
            stage: AtomicU8::new(behind::OPEN),
            refused: AtomicBool::new(false),
        }
    }

    /// The connection, for statements that change no state.
    pub fn client(&self) -> &'c ClientWrapper {
        self.client
    }

    /// Sends BEGIN with the marks of `open` (and prepares the tallies'
    /// statement, so that [`Tallied::end`] takes one round trip).
    pub async fn begin(&self, open: Open) -> Result<(), StoreError> {
        self.may_send(false)?;
        let (begun, prepared) = tokio::join!(
            self.client.batch_execute(open.sql()),
            self.client.prepare_cached(JOB_TALLY_ADD)
        );
        self.sent(begun)?;
        self.sent(prepared)?;
        Ok(())
    }

    /// Runs `sql` (settings: no rows, no state changed) in the transaction.
    pub async fn set(&self, sql: &'static str) -> Result<(), StoreError> {
        self.may_send(false)?;
        self.sent(self.client.batch_execute(sql).await)
    }

    /// Runs `stmt`, which changes no state (a read), in the transaction.
    pub async fn read(
        &self,
        stmt: &tokio_postgres::Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.may_send(false)?;
        self.sent(self.client.query(stmt, params).await)
    }

    /// Prepares `stmt` on the connection (once per connection: cached), so
    /// that [`Tallied::run`] sends it at its first poll. Statements sent
    /// together are executed in the order they were first polled.
    pub async fn prepare(&self, stmt: &Changes) -> Result<Prepared, StoreError> {
        Ok(Prepared {
            statement: self.client.prepare_cached(stmt.sql).await?,
            delta: stmt.delta,
            tallies: stmt.tallies,
        })
    }

    /// Runs `stmt`, counting what its rows change.
    pub async fn run(&self, stmt: &Prepared, params: &[&(dyn ToSql + Sync)]) -> Result<Vec<Row>, StoreError> {
        self.may_send(stmt.tallies)?;
        let rows = self.sent(self.client.query(&stmt.statement, params).await)?;
        let mut delta = Delta::default();
        for row in &rows {
            (stmt.delta)(row, &mut delta)?;
        }
        self.lock().merge(delta);
        Ok(rows)
    }

    /// Prepares and runs `stmt`, counting what its rows change, and makes
    /// each row into what `each` makes of it as the row arrives: while
    /// PostgreSQL is still writing the rows after it (an `INSERT ...
    /// RETURNING` sends each row as it is written), not once the last has
    /// come. `each` is given the statement's columns with each row.
    pub async fn query_each<R>(
        &self,
        stmt: &Changes,
        params: &[&(dyn ToSql + Sync)],
        mut each: impl FnMut(&[Column], &Row) -> Result<R, StoreError>,
    ) -> Result<Vec<R>, StoreError> {
        let prepared = self.prepare(stmt).await?;
        self.may_send(prepared.tallies)?;
        let rows = self.sent(
            self.client
                .query_raw(&prepared.statement, params.iter().map(|p| *p as &dyn ToSql))
                .await,
        )?;
        futures_util::pin_mut!(rows);
        let columns = prepared.statement.columns();
        let mut delta = Delta::default();
        let mut made = Vec::new();
        while let Some(row) = rows.try_next().await? {
            (prepared.delta)(&row, &mut delta)?;
            made.push(each(columns, &row)?);
        }
        self.lock().merge(delta);
        Ok(made)
    }

    /// Prepares and runs `stmt`, counting what its rows change.
    pub async fn query(
        &self,
        stmt: &Changes,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let prepared = self.prepare(stmt).await?;
        self.run(&prepared, params).await
    }

    /// The tallies it will write, so far.
    pub fn delta(&self) -> Delta {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Delta> {
        self.delta
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ends the transaction as `outcome` says: when it is `Ok`, writes the
    /// deltas and commits, in one round trip, and answers it (or the
    /// commit's error); otherwise rolls back and answers the error.
    pub async fn end<T>(self, outcome: Result<T, StoreError>) -> Result<T, StoreError> {
        let value = self.or_roll_back(outcome).await?;
        self.commit(std::future::ready(value)).await
    }

    /// [`Tallied::end`], answering what `then` makes of the value, made
    /// while the COMMIT travels and PostgreSQL flushes it (an answer's
    /// bytes). `then` runs before the commit is known to have gone
    /// through: it must only make its value, which a failed COMMIT drops.
    pub async fn end_then<T, U>(
        self,
        outcome: Result<T, StoreError>,
        then: impl FnOnce(T) -> U,
    ) -> Result<U, StoreError> {
        let value = self.or_roll_back(outcome).await?;
        self.commit(async {
            // The COMMIT, handed over first, wakes the connection's task on
            // this thread, where no other thread may take it: yielding lets
            // it send the COMMIT before `then` holds the thread.
            tokio::task::yield_now().await;
            then(value)
        })
        .await
    }

    /// The value of `outcome`, or its error once the transaction is rolled
    /// back.
    pub async fn or_roll_back<T>(&self, outcome: Result<T, StoreError>) -> Result<T, StoreError> {
        if outcome.is_err() {
            // A connection that cannot roll back is broken: the pool drops
            // it at its next check.
            if let Err(rollback) = self.client.batch_execute("ROLLBACK").await {
                tracing::debug!(error = %rollback, "rollback failed");
            }
        }
        outcome
    }

    /// Writes the deltas and commits, in one round trip, while `made` runs;
    /// answers what it made, or the commit's error.
    async fn commit<U>(self, made: impl Future<Output = U>) -> Result<U, StoreError> {
        let delta = std::mem::take(&mut *self.lock());
        self.write_and_commit(delta, made).await
    }

    /// [`Tallied::commit`] of `delta`.
    async fn write_and_commit<U>(
        &self,
        delta: Delta,
        made: impl Future<Output = U>,
    ) -> Result<U, StoreError> {
        if delta.is_empty() {
            let (committed, made) = tokio::join!(self.client.batch_execute("COMMIT"), made);
            committed?;
            return Ok(made);
        }
        let add = self.client.prepare_cached(JOB_TALLY_ADD).await?;
        let (queues, tallies, counts) = delta.columns();
        // A refused insert aborts the transaction: the COMMIT then rolls
        // back, and the insert's error is answered.
        let params: [&(dyn ToSql + Sync); 3] = [&queues, &tallies, &counts];
        let (added, committed, made) = tokio::join!(
            self.client.execute(&add, &params),
            self.client.batch_execute("COMMIT"),
            made
        );
        added?;
        committed?;
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delta_sums_per_queue_and_tally_and_forgets_zeros() {
        let mut d = Delta::default();
        d.entered("a", JobState::Done);
        d.entered("a", JobState::Done);
        d.entered("a", JobState::Queued);
        d.entered("b", JobState::Cancelled);
        d.left("b", JobState::Cancelled);
        d.left("a", JobState::Failed);
        d.add("a", Tally::Retries, 3);
        assert_eq!(d.get("a", Tally::Done), 2);
        assert_eq!(d.get("a", Tally::Failed), -1);
        assert_eq!(d.get("a", Tally::Retries), 3);
        assert_eq!(d.get("b", Tally::Cancelled), 0);
        let (queues, tallies, counts) = d.columns();
        assert_eq!(queues, ["a", "a", "a"]);
        assert_eq!(tallies, ["done", "failed", "retries"]);
        assert_eq!(counts, [2, -1, 3]);
        let mut e = Delta::default();
        e.add("a", Tally::Done, -2);
        d.merge(e);
        assert_eq!(d.get("a", Tally::Done), 0);
        assert_eq!(d.columns().0.len(), 2);
    }

    #[test]
    fn only_terminal_states_have_a_tally() {
        for state in [
            JobState::Blocked,
            JobState::Queued,
            JobState::Running,
            JobState::EnqueueFailed,
        ] {
            assert_eq!(Tally::terminal(state), None);
        }
        assert_eq!(Tally::terminal(JobState::Done), Some(Tally::Done));
        assert_eq!(Tally::terminal(JobState::Failed), Some(Tally::Failed));
        assert_eq!(Tally::terminal(JobState::Cancelled), Some(Tally::Cancelled));
    }
}
