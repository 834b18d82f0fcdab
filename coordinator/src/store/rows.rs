//! PostgreSQL rows to protocol types. Statements that return jobs return the
//! whole row (`RETURNING *` / `SELECT *`), so one mapper reads them all by name.

use std::collections::HashMap;
use std::error::Error;

use chrono::{DateTime, Utc};
use runlease_protocol::{Attempt, AttemptOutcome, Job, JobId, JobState, QueueName, RunLease, WorkerId};
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type};
use uuid::Uuid;

use crate::store::StoreError;

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

/// A job row: the protocol job (chronology not yet attached) plus the fields
/// of the running attempt, which lives on the row until it ends.
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// The job as answered, `attempts` empty.
    pub job: Job,
    /// Owner of the latest claim.
    pub owned_by: Option<String>,
    /// Time of the latest claim.
    pub claimed_at: Option<DateTime<Utc>>,
}

fn bad_row(e: impl std::fmt::Display) -> StoreError {
    StoreError::Database(format!("unexpected row: {e}"))
}

/// Reads column `name` of `row`; a missing or mistyped column is a store fault.
pub fn col<'a, T: FromSql<'a>>(row: &'a Row, name: &str) -> Result<T, StoreError> {
    row.try_get(name).map_err(bad_row)
}

impl JobRecord {
    /// Reads a full `jobs` row.
    pub fn from_row(row: &Row) -> Result<Self, StoreError> {
        let queue: String = col(row, "queue")?;
        let state: DbJobState = col(row, "state")?;
        let cancel_requested_at: Option<DateTime<Utc>> = col(row, "cancel_requested_at")?;
        let job = Job {
            id: JobId(col::<Uuid>(row, "id")?),
            queue: QueueName::new(queue).map_err(bad_row)?,
            state: state.0,
            payload: col(row, "payload")?,
            priority: col(row, "priority")?,
            attempt: col(row, "attempt")?,
            max_attempts: col(row, "max_attempts")?,
            run_lease: RunLease(col(row, "run_lease")?),
            run_at: col(row, "run_at")?,
            created_at: col(row, "created_at")?,
            updated_at: col(row, "updated_at")?,
            finished_at: col(row, "finished_at")?,
            timeout_ms: col(row, "timeout_ms")?,
            idempotency_key: col(row, "idempotency_key")?,
            progress: col(row, "progress")?,
            result: col(row, "result")?,
            error: col(row, "error")?,
            cancel_requested: cancel_requested_at.is_some(),
            attempts: Vec::new(),
        };
        Ok(Self {
            job,
            owned_by: col(row, "owned_by")?,
            claimed_at: col(row, "claimed_at")?,
        })
    }

    /// Reads every row of an answer.
    pub fn from_rows(rows: &[Row]) -> Result<Vec<Self>, StoreError> {
        rows.iter().map(Self::from_row).collect()
    }

    /// The running attempt, which is on the row and not yet in `job_attempts`.
    fn running_attempt(&self) -> Option<Attempt> {
        if self.job.state != JobState::Running {
            return None;
        }
        Some(Attempt {
            run_lease: self.job.run_lease,
            worker_id: WorkerId::new(self.owned_by.clone()?).ok()?,
            claimed_at: self.claimed_at?,
            finished_at: None,
            outcome: None,
            error: None,
        })
    }
}

/// Reads `attempt_list` rows, grouped by job.
pub fn attempts_by_job(rows: &[Row]) -> Result<HashMap<JobId, Vec<Attempt>>, StoreError> {
    let mut by_job: HashMap<JobId, Vec<Attempt>> = HashMap::new();
    for row in rows {
        let job_id = JobId(col::<Uuid>(row, "job_id")?);
        let worker: String = col(row, "worker_id")?;
        let outcome: DbOutcome = col(row, "outcome")?;
        by_job.entry(job_id).or_default().push(Attempt {
            run_lease: RunLease(col(row, "run_lease")?),
            worker_id: WorkerId::new(worker).map_err(bad_row)?,
            claimed_at: col(row, "claimed_at")?,
            finished_at: Some(col(row, "finished_at")?),
            outcome: Some(outcome.0),
            error: col(row, "error")?,
        });
    }
    Ok(by_job)
}

/// Attaches each job's chronology: its ended attempts, then the running one.
pub fn assemble(records: Vec<JobRecord>, attempts: &HashMap<JobId, Vec<Attempt>>) -> Vec<Job> {
    records
        .into_iter()
        .map(|record| {
            let running = record.running_attempt();
            let mut job = record.job;
            job.attempts = attempts.get(&job.id).cloned().unwrap_or_default();
            job.attempts.extend(running);
            job
        })
        .collect()
}
