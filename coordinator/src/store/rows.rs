//! PostgreSQL rows to the store's own types. Statements that return jobs
//! return the whole row (`RETURNING *` / `SELECT *`), so one mapper reads
//! them all by name.

use std::collections::HashMap;
use std::error::Error;

use chrono::{DateTime, Utc};
use runlease_protocol::limits::MAX_ATTEMPTS_PER_JOB_ANSWER;
use runlease_protocol::{
    AttemptOutcome, Backoff, JobId, JobState, OnDependencyFailure, QueueName, RunLease, TraceParent, WorkerId,
};
use serde_json::Value;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::{Column, Row};
use uuid::Uuid;

use crate::store::StoreError;
use crate::store::dependencies::{DependencyRow, Link};

/// `job_state` as PostgreSQL sends it (an enum's binary form is its label).
pub struct DbJobState(pub JobState);

impl<'a> FromSql<'a> for DbJobState {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        Ok(DbJobState(std::str::from_utf8(raw)?.parse()?))
    }

    fn accepts(ty: &Type) -> bool {
        ty.name() == "job_state"
    }
}

/// `attempt_outcome` as PostgreSQL sends it.
pub struct DbOutcome(pub AttemptOutcome);

impl<'a> FromSql<'a> for DbOutcome {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn Error + Sync + Send>> {
        Ok(DbOutcome(std::str::from_utf8(raw)?.parse()?))
    }

    fn accepts(ty: &Type) -> bool {
        ty.name() == "attempt_outcome"
    }
}

/// A `jobs` row as the store reads it, with its chronology once attached.
/// The HTTP layer turns it into the protocol's job (`http::views`); the
/// store never answers wire types.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    /// The job's id.
    pub id: JobId,
    /// Its queue.
    pub queue: QueueName,
    /// Its state.
    pub state: JobState,
    /// What the producer enqueued.
    pub payload: Value,
    /// Smaller runs first.
    pub priority: i32,
    /// Attempts charged.
    pub attempt: i32,
    /// Attempt budget.
    pub max_attempts: i32,
    /// Its backoff as fixed at enqueue (unset fields: the defaults).
    pub backoff: Backoff,
    /// Its retry window as fixed at enqueue.
    pub retry_window_ms: Option<i64>,
    /// The latest run lease handed out.
    pub run_lease: RunLease,
    /// Not claimable before.
    pub run_at: DateTime<Utc>,
    /// Enqueued at.
    pub created_at: DateTime<Utc>,
    /// Last changed at.
    pub updated_at: DateTime<Utc>,
    /// Terminal since.
    pub finished_at: Option<DateTime<Utc>>,
    /// Attempt timeout the producer set.
    pub timeout_ms: Option<i64>,
    /// The producer's idempotency key.
    pub idempotency_key: Option<String>,
    /// The job's concurrency key.
    pub concurrency_key: Option<String>,
    /// The last checkpoint.
    pub progress: Option<Value>,
    /// The completing worker's result.
    pub result: Option<Value>,
    /// The last error recorded.
    pub error: Option<String>,
    /// When a cancel was requested of the running job.
    pub cancel_requested_at: Option<DateTime<Utc>>,
    /// Owner of the latest claim.
    pub owned_by: Option<String>,
    /// Time of the latest claim.
    pub claimed_at: Option<DateTime<Utc>>,
    /// The producer's W3C trace context.
    pub traceparent: Option<TraceParent>,
    /// The chronology, oldest first, the running attempt last; empty until
    /// attached ([`assemble`]). At most the latest
    /// [`MAX_ATTEMPTS_PER_JOB_ANSWER`] ended attempts.
    pub attempts: Vec<AttemptRow>,
    /// Older ended attempts exist than those in `attempts`.
    pub earlier_attempts: bool,
    /// What a failed dependency does to it (`None`: it has none).
    pub on_dependency_failure: Option<OnDependencyFailure>,
    /// How many dependencies it has.
    pub dependency_count: i32,
    /// How many dependents it was given.
    pub dependent_count: i32,
    /// Its dependencies with their states; empty until attached
    /// ([`crate::store::dependencies::attach_links`]).
    pub dependencies: Vec<Link>,
    /// Its first dependents with their states; empty until attached.
    pub dependents: Vec<Link>,
}

/// One attempt of a job: a `job_attempts` row, or the running attempt that
/// lives on the job row until it ends.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRow {
    /// The lease it ran under.
    pub run_lease: RunLease,
    /// Who claimed it.
    pub worker_id: WorkerId,
    /// When the claim committed.
    pub claimed_at: DateTime<Utc>,
    /// When it ended (`None` while running).
    pub finished_at: Option<DateTime<Utc>>,
    /// How it ended (`None` while running).
    pub outcome: Option<AttemptOutcome>,
    /// The error recorded.
    pub error: Option<String>,
    /// When the retry it queued may start.
    pub retry_at: Option<DateTime<Utc>>,
    /// Why it was retried then, or why it ended the job.
    pub retry_reason: Option<String>,
}

fn bad_row(e: impl std::fmt::Display) -> StoreError {
    StoreError::Database(format!("unexpected row: {e}"))
}

/// Reads queue column `name` of `row` as a queue name.
pub fn queue_col(row: &Row, name: &str) -> Result<QueueName, StoreError> {
    QueueName::new(col::<String>(row, name)?).map_err(bad_row)
}

/// Reads the `traceparent` column. A statement that lists its columns and
/// leaves this one out answers `None` rather than fail, since the trace
/// context is a hint for observability, never a reason to refuse a job.
fn traceparent_col(row: &Row) -> Result<Option<TraceParent>, StoreError> {
    Ok(as_traceparent(col_or_default(row, "traceparent")?))
}

/// A stored trace context; a value that is not a valid traceparent (written
/// by hand) is read as none.
fn as_traceparent(text: Option<&str>) -> Option<TraceParent> {
    text.and_then(|t| TraceParent::parse(t).ok())
}

/// Reads column `name` of `row`, or the type's default when the statement
/// does not answer that column (the dependency columns, the retry policy's,
/// which statements that list their columns leave out where they do not
/// concern them).
pub fn col_or_default<'a, T: FromSql<'a> + Default>(row: &'a Row, name: &str) -> Result<T, StoreError> {
    at_or_default(row, row.columns().iter().position(|c| c.name() == name))
}

/// Reads column `name` of `row`; a missing or mistyped column is a store fault.
pub fn col<'a, T: FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, StoreError> {
    row.try_get(name).map_err(bad_row)
}

/// Where the columns of a `jobs` row sit in an answer, found by name once
/// for all its rows (every row of an answer has the same columns; a lookup
/// by name walks them, and a batch enqueue answers 1,000 jobs).
pub struct JobColumns {
    id: usize,
    queue: usize,
    state: usize,
    payload: usize,
    priority: usize,
    attempt: usize,
    max_attempts: usize,
    run_lease: usize,
    run_at: usize,
    created_at: usize,
    updated_at: usize,
    finished_at: usize,
    timeout_ms: usize,
    idempotency_key: usize,
    concurrency_key: usize,
    progress: usize,
    result: usize,
    error: usize,
    cancel_requested_at: usize,
    owned_by: usize,
    claimed_at: usize,
    // A statement that lists its columns may leave these out: read as
    // unset (the retry policy, the trace context) or as no dependencies.
    backoff_base_ms: Option<usize>,
    backoff_max_ms: Option<usize>,
    backoff_factor: Option<usize>,
    backoff_jitter: Option<usize>,
    retry_window_ms: Option<usize>,
    traceparent: Option<usize>,
    on_dependency_failure: Option<usize>,
    dependencies: Option<usize>,
    dependents: Option<usize>,
}

impl JobColumns {
    /// The positions in an answer with `columns`; a column a job needs
    /// that is missing is a store fault.
    pub fn of(columns: &[Column]) -> Result<Self, StoreError> {
        let find = |name: &str| columns.iter().position(|c| c.name() == name);
        let need = |name: &str| find(name).ok_or_else(|| bad_row(format!("no column {name}")));
        Ok(Self {
            id: need("id")?,
            queue: need("queue")?,
            state: need("state")?,
            payload: need("payload")?,
            priority: need("priority")?,
            attempt: need("attempt")?,
            max_attempts: need("max_attempts")?,
            run_lease: need("run_lease")?,
            run_at: need("run_at")?,
            created_at: need("created_at")?,
            updated_at: need("updated_at")?,
            finished_at: need("finished_at")?,
            timeout_ms: need("timeout_ms")?,
            idempotency_key: need("idempotency_key")?,
            concurrency_key: need("concurrency_key")?,
            progress: need("progress")?,
            result: need("result")?,
            error: need("error")?,
            cancel_requested_at: need("cancel_requested_at")?,
            owned_by: need("owned_by")?,
            claimed_at: need("claimed_at")?,
            backoff_base_ms: find("backoff_base_ms"),
            backoff_max_ms: find("backoff_max_ms"),
            backoff_factor: find("backoff_factor"),
            backoff_jitter: find("backoff_jitter"),
            retry_window_ms: find("retry_window_ms"),
            traceparent: find("traceparent"),
            on_dependency_failure: find("on_dependency_failure"),
            dependencies: find("dependencies"),
            dependents: find("dependents"),
        })
    }
}

/// Column `i` of `row`; a mistyped column is a store fault.
fn at<'a, T: FromSql<'a>>(row: &'a Row, i: usize) -> Result<T, StoreError> {
    row.try_get(i).map_err(bad_row)
}

/// Column `i` of `row` when the answer has it, else the type's default.
fn at_or_default<'a, T: FromSql<'a> + Default>(row: &'a Row, i: Option<usize>) -> Result<T, StoreError> {
    i.map_or(Ok(T::default()), |i| at(row, i))
}

impl JobRow {
    /// Reads a full `jobs` row.
    pub fn from_row(row: &Row) -> Result<Self, StoreError> {
        Self::read(row, &JobColumns::of(row.columns())?)
    }

    /// Reads every row of an answer.
    pub fn from_rows(rows: &[Row]) -> Result<Vec<Self>, StoreError> {
        let Some(first) = rows.first() else {
            return Ok(Vec::new());
        };
        let columns = JobColumns::of(first.columns())?;
        rows.iter().map(|row| Self::read(row, &columns)).collect()
    }

    /// Reads a `jobs` row whose columns sit where `c` says.
    pub fn read(row: &Row, c: &JobColumns) -> Result<Self, StoreError> {
        let state: DbJobState = at(row, c.state)?;
        let traceparent: Option<&str> = at_or_default(row, c.traceparent)?;
        let on_dependency_failure: Option<String> = at_or_default(row, c.on_dependency_failure)?;
        Ok(Self {
            id: JobId(at::<Uuid>(row, c.id)?),
            queue: QueueName::new(at::<String>(row, c.queue)?).map_err(bad_row)?,
            state: state.0,
            payload: at(row, c.payload)?,
            priority: at(row, c.priority)?,
            attempt: at(row, c.attempt)?,
            max_attempts: at(row, c.max_attempts)?,
            backoff: Backoff {
                base_ms: at_or_default(row, c.backoff_base_ms)?,
                max_ms: at_or_default(row, c.backoff_max_ms)?,
                factor: at_or_default(row, c.backoff_factor)?,
                jitter: at_or_default(row, c.backoff_jitter)?,
            },
            retry_window_ms: at_or_default(row, c.retry_window_ms)?,
            run_lease: RunLease(at(row, c.run_lease)?),
            run_at: at(row, c.run_at)?,
            created_at: at(row, c.created_at)?,
            updated_at: at(row, c.updated_at)?,
            finished_at: at(row, c.finished_at)?,
            timeout_ms: at(row, c.timeout_ms)?,
            idempotency_key: at(row, c.idempotency_key)?,
            concurrency_key: at(row, c.concurrency_key)?,
            progress: at(row, c.progress)?,
            result: at(row, c.result)?,
            error: at(row, c.error)?,
            cancel_requested_at: at(row, c.cancel_requested_at)?,
            owned_by: at(row, c.owned_by)?,
            claimed_at: at(row, c.claimed_at)?,
            traceparent: as_traceparent(traceparent),
            attempts: Vec::new(),
            earlier_attempts: false,
            on_dependency_failure: on_dependency_failure
                .map(|p| p.parse())
                .transpose()
                .map_err(bad_row)?,
            dependency_count: at_or_default(row, c.dependencies)?,
            dependent_count: at_or_default(row, c.dependents)?,
            dependencies: Vec::new(),
            dependents: Vec::new(),
        })
    }

    /// The running attempt, which is on the row and not yet in `job_attempts`.
    fn running_attempt(&self) -> Option<AttemptRow> {
        if self.state != JobState::Running {
            return None;
        }
        Some(AttemptRow {
            run_lease: self.run_lease,
            worker_id: WorkerId::new(self.owned_by.clone()?).ok()?,
            claimed_at: self.claimed_at?,
            finished_at: None,
            outcome: None,
            error: None,
            retry_at: None,
            retry_reason: None,
        })
    }
}

/// A job as a claim hands it out: what its lease carries, and no more of
/// the row (`lease_claim.sql` and `lease_claim_keyed.sql` return only these
/// columns: every other one would be sent, read and dropped for each job).
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedJob {
    /// The job.
    pub id: JobId,
    /// Its queue.
    pub queue: QueueName,
    /// The lease the claim took (the job's new `run_lease`).
    pub run_lease: RunLease,
    /// What the producer enqueued.
    pub payload: Value,
    /// This attempt's number (1-based).
    pub attempt: i32,
    /// The checkpoint an earlier attempt saved.
    pub progress: Option<Value>,
    /// The job's own attempt timeout (`None`: the coordinator's default).
    pub timeout_ms: Option<i64>,
    /// The producer's trace context.
    pub traceparent: Option<TraceParent>,
    /// Attempts the job may have in all.
    pub max_attempts: i32,
    /// Whether it has dependencies (then a look-up fills `dependencies`).
    pub has_dependencies: bool,
    /// Its dependencies, each ended, with their states and results.
    pub dependencies: Vec<DependencyRow>,
}

impl ClaimedJob {
    /// Reads a row of a claim.
    pub fn from_row(row: &Row) -> Result<Self, StoreError> {
        Ok(Self {
            id: JobId(col::<Uuid>(row, "id")?),
            queue: queue_col(row, "queue")?,
            run_lease: RunLease(col(row, "run_lease")?),
            payload: col(row, "payload")?,
            attempt: col(row, "attempt")?,
            progress: col(row, "progress")?,
            timeout_ms: col(row, "timeout_ms")?,
            traceparent: traceparent_col(row)?,
            max_attempts: col(row, "max_attempts")?,
            has_dependencies: col_or_default::<i32>(row, "dependencies")? > 0,
            dependencies: Vec::new(),
        })
    }
}

/// Reads `attempt_list` rows, grouped by job.
pub fn attempts_by_job(rows: &[Row]) -> Result<HashMap<JobId, Vec<AttemptRow>>, StoreError> {
    let mut by_job: HashMap<JobId, Vec<AttemptRow>> = HashMap::new();
    for row in rows {
        let job_id = JobId(col::<Uuid>(row, "job_id")?);
        let worker: String = col(row, "worker_id")?;
        let outcome: DbOutcome = col(row, "outcome")?;
        by_job.entry(job_id).or_default().push(AttemptRow {
            run_lease: RunLease(col(row, "run_lease")?),
            worker_id: WorkerId::new(worker).map_err(bad_row)?,
            claimed_at: col(row, "claimed_at")?,
            finished_at: Some(col(row, "finished_at")?),
            outcome: Some(outcome.0),
            error: col(row, "error")?,
            retry_at: col(row, "retry_at")?,
            retry_reason: col(row, "retry_reason")?,
        });
    }
    Ok(by_job)
}

/// The length of a JSON value as it is written in an answer, without
/// writing it anywhere.
pub fn json_len(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// A bound on the bytes of a job's fields other than its JSON values and
/// its error, in an answer.
pub const FIXED_FIELD_BYTES: usize = 1024;

impl JobRow {
    /// About how many bytes the job (without its chronology) takes in an
    /// answer.
    pub fn answer_bytes(&self) -> usize {
        let values = [&self.payload]
            .into_iter()
            .chain(self.result.as_ref())
            .chain(self.progress.as_ref());
        FIXED_FIELD_BYTES + values.map(json_len).sum::<usize>() + self.error.as_ref().map_or(0, String::len)
    }
}

impl ClaimedJob {
    /// About how many bytes the job takes in a claim's answer.
    pub fn answer_bytes(&self) -> usize {
        FIXED_FIELD_BYTES
            + json_len(&self.payload)
            + self.progress.as_ref().map_or(0, json_len)
            + self
                .dependencies
                .iter()
                .map(|d| FIXED_FIELD_BYTES / 4 + d.result.as_ref().map_or(0, json_len))
                .sum::<usize>()
    }
}

/// Ended attempts asked of `attempt_list.sql` per job: one more than an
/// answer carries, to know whether earlier ones exist.
pub const ATTEMPTS_ASKED: i64 = MAX_ATTEMPTS_PER_JOB_ANSWER as i64 + 1;

/// Attaches each job's chronology: its latest ended attempts (as
/// `attempt_list.sql` read them, [`ATTEMPTS_ASKED`] at most), then the
/// running one.
pub fn assemble(mut rows: Vec<JobRow>, attempts: &HashMap<JobId, Vec<AttemptRow>>) -> Vec<JobRow> {
    for row in &mut rows {
        let running = row.running_attempt();
        let ended = attempts.get(&row.id).map_or(&[][..], Vec::as_slice);
        let (earlier, kept) = keep_latest(ended, MAX_ATTEMPTS_PER_JOB_ANSWER as usize);
        row.attempts = kept.to_vec();
        row.earlier_attempts = earlier;
        row.attempts.extend(running);
    }
    rows
}

/// The last `most` of `attempts` (oldest first), and whether any were left out.
pub fn keep_latest(attempts: &[AttemptRow], most: usize) -> (bool, &[AttemptRow]) {
    let cut = attempts.len().saturating_sub(most);
    (cut > 0, &attempts[cut..])
}
