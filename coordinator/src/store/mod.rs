//! PostgreSQL, the one authority: every job write is a statement from
//! `sql/*.sql`, and every worker write is guarded on `(id, state = 'running',
//! run_lease)`.
//!
//! - [`connect`]: URL, TLS, pool, database creation.
//! - [`migrate`]: the migrator.
//! - [`rows`]: PostgreSQL rows to protocol types.
//! - [`jobs`]: producer operations (enqueue, get, cancel, retry).
//! - [`dependencies`]: job dependencies: an enqueue's plan, the settling of
//!   dependents, the look-ups of leases and job answers.
//! - [`floors`]: claim floors, where each queue's claim scan starts.
//! - [`leases`]: worker operations (claim, heartbeat, complete, fail, release) and the reaper's statement.
//! - [`queues`]: queue figures (live indexes and tallies) and settings.
//! - [`retry`]: retry policies and dead-letter follow-ups as read from rows.
//! - [`listing`]: listing a queue's jobs, bulk actions.
//! - [`prune`]: retention and the folding of tallies.
//! - [`schedules`]: cron schedules and their fire pass.
//! - [`tally`]: the tallies as values, and the transactions that write them.

pub mod claims;
pub mod connect;
pub mod dependencies;
pub mod floors;
pub mod heartbeat;
pub mod jobs;
pub mod leases;
pub mod listing;
pub mod migrate;
pub mod prune;
pub mod queues;
mod reap;
pub mod retry;
pub mod rows;
pub mod schedules;
#[macro_use]
pub mod sql;
pub mod tally;

use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::PoolError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_postgres::error::SqlState;

use crate::store::connect::{Object, Pool};

/// Errors of the store. A caller branches on `Unavailable` (answer 503 and
/// retry later); everything else is a fault to log.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached, or no pooled connection freed up in time.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// PostgreSQL refused a value the client sent (SQLSTATE class 22, e.g. a
    /// `\u0000` in JSON or text): the request is invalid, nothing was written.
    #[error("{0}")]
    Rejected(String),
    /// A deadlock or serialization failure: the whole transaction may be retried.
    #[error("transient conflict: {0}")]
    Retry(String),
    /// The server reached accepts no writes (SQLSTATE 25006: a standby in
    /// recovery, an old primary after a failover, or
    /// `default_transaction_read_only`): nothing was written, and the
    /// operation may run again on a fresh connection.
    #[error("the PostgreSQL server reached is read-only: {0}")]
    ReadOnly(String),
    /// A statement prepared on the connection no longer matches its tables
    /// (SQLSTATE 0A000 from PostgreSQL's plan cache: a migration, applied by
    /// a newer coordinator during a rolling upgrade, changed the type of a
    /// column it returns): nothing of its transaction was written, and the
    /// operation may run again on a fresh connection, which prepares it
    /// anew.
    #[error("a prepared statement outlived a change of its tables: {0}")]
    Stale(String),
    /// A store operation ran past its deadline (the coordinator's, or
    /// PostgreSQL's `statement_timeout`); what it wrote, if anything, is
    /// settled by the idempotent retry.
    #[error("database operation {0} timed out")]
    Timeout(&'static str),
    /// A statement failed; a bug or a broken database.
    #[error("database error: {0}")]
    Database(String),
    /// Bad connection settings.
    #[error("{0}")]
    Config(String),
    /// A migration could not be applied.
    #[error("{0}")]
    Migration(String),
}

/// The message of a PostgreSQL error, with its SQLSTATE when the server sent one.
pub fn db_error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// The one mapping from PostgreSQL errors to store errors: connection-level
/// failures and server shutdowns are `Unavailable`, the rest `Database`.
impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        let unavailable = e.is_closed()
            || match e.code() {
                Some(code) => {
                    code.code().starts_with("08")
                        || code.code().starts_with("57P")
                        || *code == SqlState::TOO_MANY_CONNECTIONS
                        || *code == SqlState::CANNOT_CONNECT_NOW
                }
                // No SQLSTATE: an I/O or protocol failure on the connection.
                None => true,
            };
        if e.code() == Some(&SqlState::QUERY_CANCELED) {
            // statement_timeout (57014): the server ended the statement.
            StoreError::Timeout("statement")
        } else if e.code() == Some(&SqlState::READ_ONLY_SQL_TRANSACTION) {
            StoreError::ReadOnly(db_error_text(&e))
        } else if e.code() == Some(&SqlState::FEATURE_NOT_SUPPORTED)
            && e.as_db_error().and_then(|db| db.routine()) == Some("RevalidateCachedQuery")
        {
            // "cached plan must not change result type", told by the
            // routine that raises it (the message may be translated).
            StoreError::Stale(db_error_text(&e))
        } else if unavailable {
            StoreError::Unavailable(db_error_text(&e))
        } else if e.code().is_some_and(|c| {
            *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
        }) {
            StoreError::Retry(db_error_text(&e))
        } else if e.code().is_some_and(|c| c.code().starts_with("22")) {
            StoreError::Rejected(db_error_text(&e))
        } else {
            StoreError::Database(db_error_text(&e))
        }
    }
}

impl From<PoolError> for StoreError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Backend(e) => e.into(),
            other => StoreError::Unavailable(other.to_string()),
        }
    }
}

/// Lease terms and the retry policy, as durations: built once from the
/// configuration ([`crate::config::Config::lease_settings`]), what a lease
/// promises its worker and what the store writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    /// `lease_ttl_ms` of each lease.
    pub ttl: Duration,
    /// `heartbeat_interval_ms` of each lease.
    pub heartbeat_interval: Duration,
    /// Timeout of an attempt whose job sets none.
    pub default_timeout: Duration,
    /// Attempt budget of a job that sets none.
    pub default_max_attempts: i32,
    /// First retry delay of the backoff (before jitter), doubling per attempt.
    pub backoff_base: Duration,
    /// Longest retry delay of the backoff.
    pub backoff_cap: Duration,
}

/// Runs `stmt` alone in a [`tally::Tallied`] transaction (BEGIN and the
/// statement in one round trip, its tallies and COMMIT in another).
pub(crate) async fn query_changes(
    client: &deadpool_postgres::ClientWrapper,
    stmt: &tally::Changes,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, StoreError> {
    let tx = tally::Tallied::new(client);
    let (begun, rows) = tokio::join!(tx.begin(tally::Open::States), tx.query(stmt, params));
    let outcome = begun.and(rows);
    tx.end(outcome).await
}

/// A duration as the `bigint` milliseconds statements take.
pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Default backoff base: 1 s, doubling per attempt.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// Default backoff cap: 5 min.
pub const DEFAULT_BACKOFF_CAP: Duration = Duration::from_secs(300);

/// Label set of database timeouts.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// The store operation, e.g. `finish`, `claim`, `reap`.
    pub operation: &'static str,
}

thread_local! {
    /// Set while [`Store::timed`] drops an operation that overran its
    /// deadline: the connections it held are dropped with it, and are
    /// thrown away instead of going back to the pool.
    static ABANDONING: Cell<bool> = const { Cell::new(false) };
}

/// A connection taken for one store operation. Dropped normally it goes back
/// to the pool; dropped because its operation timed out it is detached and
/// closed, since it may be frozen mid-answer.
pub struct Db(Option<Object>);

impl std::ops::Deref for Db {
    type Target = Object;
    fn deref(&self) -> &Object {
        self.0
            .as_ref()
            .unwrap_or_else(|| unreachable!("a Db holds its connection until dropped"))
    }
}

impl std::ops::DerefMut for Db {
    fn deref_mut(&mut self) -> &mut Object {
        self.0
            .as_mut()
            .unwrap_or_else(|| unreachable!("a Db holds its connection until dropped"))
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if ABANDONING.with(Cell::get)
            && let Some(object) = self.0.take()
        {
            drop(deadpool::managed::Object::take(object));
        }
    }
}

/// What `/readyz` tells of PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Every migration is applied.
    pub migrations_current: bool,
    /// The server's address and port as it sees them, or `local socket`.
    pub server: String,
    /// It takes writes: not a standby, not read-only by default.
    pub writable: bool,
}

/// The job store over a connection pool.
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    leases: LeaseSettings,
    call_timeout: Duration,
    timeouts: Family<OperationLabels, Counter>,
    retries: Family<OperationLabels, Counter>,
    settled: Option<tokio::sync::mpsc::UnboundedSender<Vec<dependencies::Settled>>>,
    floors: Option<Arc<floors::ClaimFloors>>,
}

/// Tries of a store operation that hit a deadlock or a serialization failure
/// (all within its one call deadline).
const RETRY_TRIES: u32 = 4;

impl Store {
    /// A store over `pool`; each operation may take `call_timeout`.
    pub fn new(pool: Pool, leases: LeaseSettings, call_timeout: Duration) -> Self {
        Self {
            pool,
            leases,
            call_timeout,
            timeouts: Family::default(),
            retries: Family::default(),
            settled: None,
            floors: None,
        }
    }

    /// Starts claims at `floors` (kept up to date by the wake-ups that hold
    /// the same floors): without, every claim scans its queues from their
    /// first entry.
    pub fn with_claim_floors(mut self, floors: Arc<floors::ClaimFloors>) -> Self {
        self.floors = Some(floors);
        self
    }

    /// The claim floors, when claims use them.
    pub fn claim_floors(&self) -> Option<&floors::ClaimFloors> {
        self.floors.as_deref()
    }

    /// Sends the jobs whose dependencies settled (queued or cancelled by
    /// the statement that ended their dependencies) to `sink`, after the
    /// transaction that settled them commits: their wake-ups and metrics
    /// are sent from there, whichever operation ended the dependency.
    pub fn report_settled_to(
        mut self,
        sink: tokio::sync::mpsc::UnboundedSender<Vec<dependencies::Settled>>,
    ) -> Self {
        self.settled = Some(sink);
        self
    }

    /// Reports jobs settled by a committed transaction (see
    /// [`Store::report_settled_to`]).
    pub(crate) fn report_settled(&self, settled: Vec<dependencies::Settled>) {
        if settled.is_empty() {
            return;
        }
        if let Some(sink) = &self.settled
            && sink.send(settled).is_err()
        {
            tracing::debug!("settled dependents not announced: the announcer has stopped");
        }
    }

    /// Counts timed-out operations in `family` (the coordinator's
    /// `runlease_db_timeouts_total`).
    pub fn count_timeouts_in(mut self, family: Family<OperationLabels, Counter>) -> Self {
        self.timeouts = family;
        self
    }

    /// Counts retried operations in `family` (the coordinator's
    /// `runlease_db_retries_total`).
    pub fn count_retries_in(mut self, family: Family<OperationLabels, Counter>) -> Self {
        self.retries = family;
        self
    }

    /// Runs one store operation under the call deadline. `work` makes the
    /// operation's future; one that hits a deadlock or a serialization
    /// failure (nothing of it was written) is made and run again, up to
    /// [`RETRY_TRIES`] times, counted. An operation that overruns the
    /// deadline is dropped (its connections are thrown away, never handed
    /// out again), counted, logged, and answered [`StoreError::Timeout`].
    pub(crate) async fn timed<T, F, Fut>(&self, operation: &'static str, work: F) -> Result<T, StoreError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        self.timed_within(operation, self.call_timeout, work).await
    }

    /// Before a retry that a fresh connection mends (`why`): the pool's idle
    /// connections are dropped, the retry counted and logged.
    fn renew_connections(&self, operation: &'static str, tries: u32, detail: &str, why: &'static str) {
        let dropped = self.pool.retain(|_, _| false).removed.len();
        self.retries.get_or_create(&OperationLabels { operation }).inc();
        tracing::warn!(
            operation,
            %detail,
            tries,
            idle_connections_dropped = dropped,
            "{why}; retrying on a fresh connection"
        );
    }

    /// [`Store::timed`] with a deadline of its own, for the rare operation
    /// that sets a longer `statement_timeout` for itself.
    pub(crate) async fn timed_within<T, F, Fut>(
        &self,
        operation: &'static str,
        deadline: Duration,
        work: F,
    ) -> Result<T, StoreError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let retrying = async {
            let mut tries = 1;
            loop {
                match work().await {
                    Err(StoreError::Retry(detail)) if tries < RETRY_TRIES => {
                        self.retries.get_or_create(&OperationLabels { operation }).inc();
                        tracing::info!(operation, %detail, tries, "deadlock or serialization failure; retrying");
                        tries += 1;
                    }
                    Err(StoreError::ReadOnly(detail)) if tries < RETRY_TRIES => {
                        // The connection landed on a server that takes no
                        // writes (a failover moved the primary). Its idle
                        // neighbours went to the same server: all are
                        // dropped, and the retry opens a fresh connection,
                        // which `target_session_attrs=read-write` sends to
                        // the writable host.
                        self.renew_connections(operation, tries, &detail, "PostgreSQL server is read-only");
                        tries += 1;
                    }
                    Err(StoreError::Stale(detail)) if tries < RETRY_TRIES => {
                        // Every connection prepared its statements before
                        // the change: the idle ones are dropped with theirs
                        // (this operation's among them), and the retry
                        // prepares on a fresh connection.
                        self.renew_connections(
                            operation,
                            tries,
                            &detail,
                            "a table changed under the connection's prepared statements",
                        );
                        tries += 1;
                    }
                    done => return done,
                }
            }
        };
        let mut work = Box::pin(retrying);
        match tokio::time::timeout(deadline, &mut work).await {
            Ok(Err(StoreError::Timeout(_))) => {
                self.timeouts.get_or_create(&OperationLabels { operation }).inc();
                tracing::warn!(operation, "a database statement ran past statement_timeout");
                Err(StoreError::Timeout(operation))
            }
            Ok(done) => done,
            Err(_) => {
                ABANDONING.with(|a| a.set(true));
                drop(work);
                ABANDONING.with(|a| a.set(false));
                // No answer at all, not even PostgreSQL's statement timeout:
                // the network path is likely gone (a failover, a partition),
                // and the idle connections opened over it with it. They are
                // dropped too; new ones are opened as needed.
                let dropped = self.pool.retain(|_, _| false).removed.len();
                self.timeouts.get_or_create(&OperationLabels { operation }).inc();
                tracing::warn!(
                    operation,
                    timeout_ms = deadline.as_millis() as u64,
                    idle_connections_dropped = dropped,
                    "database operation timed out; its connection is thrown away"
                );
                Err(StoreError::Timeout(operation))
            }
        }
    }

    /// The pool, for readiness checks and metrics.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The lease terms and retry policy.
    pub fn lease_settings(&self) -> &LeaseSettings {
        &self.leases
    }

    async fn conn(&self) -> Result<Db, StoreError> {
        Ok(Db(Some(self.pool.get().await?)))
    }

    /// Whether PostgreSQL answers, takes writes and has the current
    /// schema, within `deadline`. A server that takes no writes (a standby
    /// reached after a failover) has the idle connections dropped, so the
    /// next ones go to the writable host.
    pub async fn ready(&self, deadline: Duration) -> Result<Readiness, StoreError> {
        let check = async {
            let migrations_current = migrate::is_current(&self.pool).await?;
            let row = self.conn().await?.query_one(sql::SERVER_STATUS, &[]).await?;
            Ok::<_, StoreError>(Readiness {
                migrations_current,
                server: row.get("server"),
                writable: row.get("writable"),
            })
        };
        match tokio::time::timeout(deadline, check).await {
            Ok(Ok(readiness)) => {
                if !readiness.writable {
                    self.pool.retain(|_, _| false);
                }
                Ok(readiness)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => {
                self.timeouts
                    .get_or_create(&OperationLabels { operation: "ready" })
                    .inc();
                Err(StoreError::Timeout("ready"))
            }
        }
    }
}
