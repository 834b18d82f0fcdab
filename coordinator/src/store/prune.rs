//! Retention: deleting terminal jobs (and their attempts) once they have
//! been terminal longer than their queue's retention, folding the tally
//! deltas, and counting the terminal tallies again when asked. Each runs
//! on one replica at a time: each statement runs in a transaction that
//! first takes a transaction-level advisory lock (the prune lock for
//! pruning and folding, the recount lock for a recount), and a replica
//! that cannot take it leaves the work to the one that holds it.

use std::time::Duration;

use runlease_protocol::{JobState, QueueName};
use uuid::Uuid;

use crate::store::rows::{DbJobState, col, queue_col};
use crate::store::tally::{Changes, Open, Tallied};
use crate::store::{Db, Store, StoreError, sql};

/// Advisory lock key of pruning ("rl-prune" in ASCII, as an i64).
const PRUNE_LOCK_KEY: i64 = 0x726c2d7072756e65;
/// Advisory lock key of recounting the tallies ("rl-recnt" in ASCII).
const RECOUNT_LOCK_KEY: i64 = 0x726c2d7265636e74;

/// What one prune statement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pruned {
    /// Another replica holds the prune lock: nothing was done.
    Busy,
    /// The jobs deleted, by queue and state.
    Deleted(Vec<(QueueName, JobState)>),
}

/// PostgreSQL's `statement_timeout` for a recount of the tallies, which
/// reads the index of every terminal job kept.
pub const RECOUNT_TIMEOUT: Duration = Duration::from_secs(600);
/// How much longer the coordinator waits for a recount's answer than
/// PostgreSQL lets it run.
const RECOUNT_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// What a fold of the tallies did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Folded {
    /// Another replica holds the prune lock: nothing was done.
    Busy,
    /// Folded.
    Done {
        /// Whether a recount was asked for (a request waits).
        recount_asked: bool,
    },
}

/// What a recount of the tallies did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recount {
    /// Another replica is recounting: nothing was done.
    Busy,
    /// Nothing asked for a recount: nothing was counted.
    NotAsked,
    /// The terminal tallies were counted again from the jobs.
    Counted,
}

/// What a sweep of the attempt log did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// Another replica is recounting or sweeping: nothing more was done
    /// (batches already committed stand).
    Busy,
    /// Nothing asked for a sweep: nothing was read.
    NotAsked,
    /// Swept: the attempts whose job was gone are deleted, and the
    /// requests seen are served.
    Swept {
        /// Attempts deleted (left by deletes of jobs made outside the
        /// coordinator).
        attempts: i64,
    },
}

/// Attempts a batch of a sweep deletes at most: a batch is a transaction,
/// so a sweep after a `TRUNCATE` of a large history commits as it goes.
const SWEEP_BATCH: i64 = 10_000;

impl Store {
    /// Deletes up to `limit` jobs of `queue` in terminal `state` that have
    /// been terminal for more than `keep_ms` (> 0), oldest first.
    pub async fn prune(
        &self,
        queue: &QueueName,
        state: JobState,
        keep_ms: i64,
        limit: i64,
    ) -> Result<Pruned, StoreError> {
        self.timed("prune", || async move {
            let client = self.conn().await?;
            let tx = Tallied::new(&client);
            let outcome = async {
                tx.begin(Open::Deletes).await?;
                let lock = client.prepare_cached(sql::PRUNE_LOCK).await?;
                if !try_lock(&***client, &lock, PRUNE_LOCK_KEY).await? {
                    return Ok(None);
                }
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                    [&queue.as_str(), &state.as_str(), &keep_ms, &limit];
                Ok(Some(delete_jobs(&tx, &sql::JOB_PRUNE, &params).await?))
            }
            .await;
            let Some(rows) = tx.end(outcome).await? else {
                return Ok(Pruned::Busy);
            };
            let deleted = rows
                .iter()
                .map(|r| {
                    let state: DbJobState = col(r, "state")?;
                    Ok((queue_col(r, "queue")?, state.0))
                })
                .collect::<Result<_, StoreError>>()?;
            Ok(Pruned::Deleted(deleted))
        })
        .await
    }

    /// The queues that hold terminal jobs.
    pub async fn queues_with_terminal_jobs(&self) -> Result<Vec<QueueName>, StoreError> {
        self.timed("prune", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::JOB_PRUNE_QUEUES).await?;
            client
                .query(&stmt, &[])
                .await?
                .iter()
                .map(|r| queue_col(r, "queue"))
                .collect()
        })
        .await
    }

    /// Folds the tally deltas into one row per (queue, tally), unless
    /// another replica is pruning (it folds then).
    pub async fn fold_tallies(&self) -> Result<Folded, StoreError> {
        self.timed("fold_tallies", || async move {
            let mut client = self.conn().await?;
            let tx = client.transaction().await?;
            let lock = tx.prepare_cached(sql::PRUNE_LOCK).await?;
            if !try_lock(&*tx, &lock, PRUNE_LOCK_KEY).await? {
                return Ok(Folded::Busy);
            }
            let stmt = tx.prepare_cached(sql::JOB_TALLY_FOLD).await?;
            let recount_asked: bool = col(&tx.query_one(&stmt, &[]).await?, "recount_asked")?;
            tx.commit().await?;
            Ok(Folded::Done { recount_asked })
        })
        .await
    }

    /// Counts the terminal tallies again from the jobs if a change made
    /// outside the coordinator asked for it (`job_tally_recount.sql`),
    /// unless another replica is recounting. It only appends a correction,
    /// so folds and prunes go on beside it. The count reads the index of
    /// every terminal job kept, so it runs under its own deadline,
    /// [`RECOUNT_TIMEOUT`], instead of the call timeout.
    pub async fn recount_tallies(&self) -> Result<Recount, StoreError> {
        self.timed_within(
            "recount_tallies",
            RECOUNT_TIMEOUT + RECOUNT_TIMEOUT_MARGIN,
            || async move {
                let mut client = self.conn().await?;
                let Some(tx) = under_recount_lock(&mut client).await? else {
                    return Ok(Recount::Busy);
                };
                let stmt = tx.prepare_cached(sql::JOB_TALLY_RECOUNT).await?;
                let requests: i64 = col(&tx.query_one(&stmt, &[]).await?, "requests")?;
                tx.commit().await?;
                Ok(if requests > 0 {
                    Recount::Counted
                } else {
                    Recount::NotAsked
                })
            },
        )
        .await
    }

    /// Deletes the attempts whose job is gone if a delete made outside the
    /// coordinator asked for it (`job_attempts_sweep.sql`), in batches of
    /// [`SWEEP_BATCH`], each its own transaction under the recount lock;
    /// the last batch serves the requests. Each batch reads the attempt
    /// log, so each runs under [`RECOUNT_TIMEOUT`] instead of the call
    /// timeout.
    pub async fn sweep_attempts(&self) -> Result<Sweep, StoreError> {
        let mut attempts = 0;
        loop {
            let batch = self
                .timed_within(
                    "sweep_attempts",
                    RECOUNT_TIMEOUT + RECOUNT_TIMEOUT_MARGIN,
                    || async move {
                        let mut client = self.conn().await?;
                        let Some(tx) = under_recount_lock(&mut client).await? else {
                            return Ok(None);
                        };
                        let stmt = tx.prepare_cached(sql::JOB_ATTEMPTS_SWEEP).await?;
                        let row = tx.query_one(&stmt, &[&SWEEP_BATCH]).await?;
                        let requests: i64 = col(&row, "requests")?;
                        let swept: i64 = col(&row, "swept")?;
                        let done: bool = col(&row, "done")?;
                        tx.commit().await?;
                        Ok(Some((requests, swept, done)))
                    },
                )
                .await?;
            match batch {
                None => return Ok(Sweep::Busy),
                Some((0, _, _)) => return Ok(Sweep::NotAsked),
                Some((_, swept, done)) => {
                    attempts += swept;
                    if done {
                        return Ok(Sweep::Swept { attempts });
                    }
                }
            }
        }
    }
}

/// Opens a read-committed transaction on `client` (whatever the database's
/// default: a statement's snapshot is then taken after the lock is won)
/// that holds the recount lock, with [`RECOUNT_TIMEOUT`] as its statement
/// timeout; `None` if another session holds the lock.
async fn under_recount_lock(
    client: &mut Db,
) -> Result<Option<deadpool_postgres::Transaction<'_>>, StoreError> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
        .start()
        .await?;
    let lock = tx.prepare_cached(sql::PRUNE_LOCK).await?;
    if !try_lock(&*tx, &lock, RECOUNT_LOCK_KEY).await? {
        return Ok(None);
    }
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}",
        RECOUNT_TIMEOUT.as_millis()
    ))
    .await?;
    Ok(Some(tx))
}

/// Runs `stmt`, a statement that deletes jobs (`job_prune.sql`,
/// `job_delete.sql`, each answering the `id`, `queue` and `state` of what
/// it deleted), in `tx` (opened with [`Open::Deletes`]), then deletes
/// those jobs' attempts in a statement of their own
/// (`job_attempts_delete.sql`: job_attempt_log has no foreign key to
/// cascade the delete, migration 9). Answers the first statement's rows.
pub(crate) async fn delete_jobs(
    tx: &Tallied<'_>,
    stmt: &Changes,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    let rows = tx.query(stmt, params).await?;
    let ids: Vec<Uuid> = rows.iter().map(|r| col(r, "id")).collect::<Result<_, _>>()?;
    if !ids.is_empty() {
        let stmt = tx.client().prepare_cached(sql::JOB_ATTEMPTS_DELETE).await?;
        tx.client().execute(&stmt, &[&ids]).await?;
    }
    Ok(rows)
}

/// Takes the transaction-level advisory lock `key` with `lock`
/// (`prune_lock.sql`, prepared on `client`) if no other session holds it;
/// answers whether it did.
async fn try_lock(
    client: &impl tokio_postgres::GenericClient,
    lock: &tokio_postgres::Statement,
    key: i64,
) -> Result<bool, StoreError> {
    col(&client.query_one(lock, &[&key]).await?, "locked")
}
