//! Retry policies and dead-letter follow-ups as the store reads them. A
//! job's policy is fixed when it is enqueued (`job_enqueue.sql` copies its
//! queue's into each field the job leaves out); the coordinator's defaults
//! fill what is still unset when a retry is planned (`job_retry_at` in the
//! schema). Both `jobs` and `queue_settings` name the policy's columns
//! alike; a job's are read with the rest of its row (`rows::JobColumns`),
//! a queue's here.

use runlease_protocol::{Backoff, JobId, QueueName};
use tokio_postgres::Row;
use uuid::Uuid;

use crate::store::rows::{col, col_or_default};
use crate::store::tally::Tallied;
use crate::store::{StoreError, sql};

/// A queue's retry policy: what the jobs enqueued on it without their own
/// take.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RetryPolicy {
    /// Attempt budget.
    pub max_attempts: Option<i32>,
    /// Backoff (fields left unset: the coordinator's defaults).
    pub backoff: Backoff,
    /// No retry starts later than this after the first attempt started.
    pub retry_window_ms: Option<i64>,
}

/// The backoff columns of a `queue_settings` row.
fn backoff_from_row(row: &Row) -> Result<Backoff, StoreError> {
    Ok(Backoff {
        base_ms: col_or_default(row, "backoff_base_ms")?,
        max_ms: col_or_default(row, "backoff_max_ms")?,
        factor: col_or_default(row, "backoff_factor")?,
        jitter: col_or_default(row, "backoff_jitter")?,
    })
}

/// `retry_window_ms` of a `queue_settings` row.
fn window_from_row(row: &Row) -> Result<Option<i64>, StoreError> {
    col_or_default(row, "retry_window_ms")
}

impl RetryPolicy {
    /// The policy columns of a `queue_settings` row.
    pub fn from_row(row: &Row) -> Result<Self, StoreError> {
        Ok(Self {
            max_attempts: col_or_default(row, "max_attempts")?,
            backoff: backoff_from_row(row)?,
            retry_window_ms: window_from_row(row)?,
        })
    }
}

/// The follow-up a job failed for good enqueued on its queue's dead-letter
/// queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The new job.
    pub id: JobId,
    /// The dead-letter queue it is on.
    pub queue: QueueName,
}

impl DeadLetter {
    /// The `dead_letter_id` and `dead_letter_queue` columns a finish or a
    /// reap answers (both NULL: no follow-up).
    pub fn from_row(row: &Row) -> Result<Option<Self>, StoreError> {
        let id: Option<Uuid> = col_or_default(row, "dead_letter_id")?;
        let queue: Option<String> = col_or_default(row, "dead_letter_queue")?;
        match (id, queue) {
            (Some(id), Some(queue)) => Ok(Some(Self {
                id: JobId(id),
                queue: QueueName::new(queue)
                    .map_err(|e| StoreError::Database(format!("unexpected queue name: {e}")))?,
            })),
            _ => Ok(None),
        }
    }
}

/// The dead-letter follow-ups to enqueue after a finish or a reap: one per job it
/// failed for good on a queue with a dead-letter queue (parallel arrays,
/// the parameters of `job_dead_letter.sql`).
#[derive(Debug, Default)]
struct FollowUps {
    ids: Vec<Uuid>,
    queues: Vec<String>,
    failed: Vec<Uuid>,
    failed_queues: Vec<String>,
    leases: Vec<i64>,
    payloads: Vec<serde_json::Value>,
    errors: Vec<Option<String>>,
    attempts: Vec<i32>,
    traceparents: Vec<Option<String>>,
}

/// Enqueues, in `tx`, the dead-letter follow-ups of the jobs that
/// `lease_finish.sql` or `lease_reap.sql` (its `rows`) failed for good on a
/// queue with a dead-letter queue: a statement only when there is one. A
/// follow-up whose queue sets no attempt budget takes `default_max_attempts`.
pub async fn enqueue_follow_ups(
    tx: &Tallied<'_>,
    rows: &[Row],
    default_max_attempts: i32,
) -> Result<(), StoreError> {
    let mut f = FollowUps::default();
    for row in rows {
        let (Some(id), Some(queue)) = (
            col_or_default::<Option<Uuid>>(row, "dead_letter_id")?,
            col_or_default::<Option<String>>(row, "dead_letter_queue")?,
        ) else {
            continue;
        };
        f.ids.push(id);
        f.queues.push(queue);
        f.failed.push(col(row, "id")?);
        f.failed_queues.push(col(row, "queue")?);
        f.leases.push(col(row, "run_lease")?);
        f.payloads.push(col(row, "payload")?);
        f.errors.push(col(row, "error")?);
        f.attempts.push(col(row, "attempt")?);
        f.traceparents.push(col(row, "traceparent")?);
    }
    if f.ids.is_empty() {
        return Ok(());
    }
    tx.query(
        &sql::JOB_DEAD_LETTER,
        &[
            &f.ids,
            &f.queues,
            &f.failed,
            &f.failed_queues,
            &f.leases,
            &f.payloads,
            &f.errors,
            &f.attempts,
            &f.traceparents,
            &default_max_attempts,
        ],
    )
    .await?;
    Ok(())
}
