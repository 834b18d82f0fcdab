//! Listing a queue's jobs, and bulk actions over the jobs a filter matches.
//! Both walk `jobs_list_idx` (queue, state, id) newest first, a bounded
//! range at a time, so neither costs more on the last page than the first.

use chrono::{DateTime, Utc};
use runlease_protocol::{JobId, JobState, QueueName};
use uuid::Uuid;

use crate::store::prune::delete_jobs;
use crate::store::rows::{DbJobState, JobRow, col, queue_col};
use crate::store::tally::{Open, Tallied};
use crate::store::{Store, StoreError, dependencies, sql};

/// The smallest UUIDv7 of millisecond `t` (its random bits all zero).
fn v7_floor(t: DateTime<Utc>) -> Uuid {
    let ms = u64::try_from(t.timestamp_millis())
        .unwrap_or(0)
        .min((1 << 48) - 1);
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    bytes[8] = 0x80;
    Uuid::from_bytes(bytes)
}

/// Most jobs one bulk statement changes: each chunk is its own short
/// transaction, so a bulk action over a million jobs never holds long locks.
pub const BULK_CHUNK: i64 = 1000;

/// Which jobs a listing or a bulk action is about.
#[derive(Debug, Clone)]
pub struct JobFilter {
    /// The queue (required: there is no "every job").
    pub queue: QueueName,
    /// States (at least one).
    pub states: Vec<JobState>,
    /// Only jobs created before this instant.
    pub created_before: Option<DateTime<Utc>>,
}

impl JobFilter {
    fn state_names(&self) -> Vec<&'static str> {
        self.states.iter().map(|s| s.as_str()).collect()
    }
}

/// What a bulk action does to each matched job: the single-job rule of the
/// same action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BulkAction {
    /// Failed or cancelled jobs back to queued (`job_retry.sql`).
    Retry,
    /// Claimable jobs cancelled, running ones asked to stop (`job_cancel.sql`).
    Cancel,
    /// Terminal jobs deleted with their attempts (`job_delete.sql`).
    Delete,
}

impl BulkAction {
    /// The action's name on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            BulkAction::Retry => "retry",
            BulkAction::Cancel => "cancel",
            BulkAction::Delete => "delete",
        }
    }
}

/// A job an action changed, as the statement left it.
#[derive(Debug, Clone)]
pub struct JobChange {
    /// The job.
    pub id: JobId,
    /// Its queue.
    pub queue: QueueName,
    /// Its state after the change (for a delete: before it).
    pub state: JobState,
    /// When it was enqueued (`None` for a delete).
    pub created_at: Option<DateTime<Utc>>,
    /// When it became terminal, if it is.
    pub finished_at: Option<DateTime<Utc>>,
}

impl JobChange {
    fn from_row(row: &tokio_postgres::Row, with_times: bool) -> Result<Self, StoreError> {
        let state: DbJobState = col(row, "state")?;
        Ok(Self {
            id: JobId(col(row, "id")?),
            queue: queue_col(row, "queue")?,
            state: state.0,
            created_at: if with_times {
                Some(col(row, "created_at")?)
            } else {
                None
            },
            finished_at: if with_times {
                col(row, "finished_at")?
            } else {
                None
            },
        })
    }
}

/// Jobs a listing reads per statement, so that a page stops reading once
/// its answer is full.
const LIST_READ_CHUNK: usize = 32;

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct Page {
    /// The jobs, newest first, without their chronology.
    pub rows: Vec<JobRow>,
    /// Where the next page starts (the last id of this one), if there is one.
    pub next: Option<JobId>,
}

/// What a bulk action did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BulkReport {
    /// Jobs the filter matched.
    pub matched: u64,
    /// Jobs the action changed (the rest its single-job rule refused).
    pub changed: u64,
}

impl Store {
    /// One page of a listing: up to `limit` jobs older than `cursor` (by
    /// id), newest first, without their chronology, and no more than
    /// `max_bytes` of them in an answer (at least one job): jobs are read a
    /// few at a time, so a page of large payloads stops early, with a
    /// cursor at its last job, instead of reading them all.
    pub async fn list_jobs(
        &self,
        filter: &JobFilter,
        cursor: Option<JobId>,
        limit: i64,
        max_bytes: usize,
    ) -> Result<Page, StoreError> {
        // One id more than the page tells whether another page follows,
        // without a count; the page ends at the last id listed, even if a
        // job was deleted before its row was read.
        let mut ids = self.list_job_ids(filter, cursor, limit + 1).await?;
        let mut more = ids.len() as i64 > limit;
        ids.truncate(limit.max(0) as usize);
        let Some(mut last) = ids.last().copied() else {
            return Ok(Page::default());
        };
        let mut rows = Vec::with_capacity(ids.len());
        let mut bytes = 0;
        'chunks: for chunk in ids.chunks(LIST_READ_CHUNK) {
            let mut read = self
                .timed("list_jobs", || async move {
                    let client = self.conn().await?;
                    let stmt = client.prepare_cached(sql::JOB_GET).await?;
                    JobRow::from_rows(&client.query(&stmt, &[&chunk]).await?)
                })
                .await?;
            read.sort_unstable_by_key(|r| std::cmp::Reverse(r.id.0));
            for row in read {
                bytes += row.answer_bytes();
                if bytes > max_bytes && !rows.is_empty() {
                    more = true;
                    last = rows.last().map_or(last, |r: &JobRow| r.id.0);
                    break 'chunks;
                }
                rows.push(row);
            }
        }
        Ok(Page {
            rows,
            next: more.then_some(JobId(last)),
        })
    }

    async fn list_job_ids(
        &self,
        filter: &JobFilter,
        cursor: Option<JobId>,
        limit: i64,
    ) -> Result<Vec<Uuid>, StoreError> {
        // Ids are UUIDv7 (their first 48 bits are the coordinator's clock at
        // enqueue, in ms): a job created before `created_before` has an id
        // below the first id of an hour later (an hour of clock difference
        // between coordinators and PostgreSQL allowed for), so the scan
        // starts there instead of walking every newer job; the created_at
        // filter stays exact.
        let start = match (
            cursor.map(|c| c.0),
            filter
                .created_before
                .map(|t| v7_floor(t + chrono::Duration::hours(1))),
        ) {
            (Some(c), Some(b)) => Some(c.min(b)),
            (c, b) => c.or(b),
        };
        self.timed("list_jobs", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::JOB_LIST).await?;
            let rows = client
                .query(
                    &stmt,
                    &[
                        &filter.queue.as_str(),
                        &filter.state_names(),
                        &start,
                        &limit,
                        &filter.created_before,
                    ],
                )
                .await?;
            rows.iter().map(|r| col(r, "id")).collect()
        })
        .await
    }

    /// Applies `action` to every job `filter` matches (only to those of
    /// `ids`, when given), a chunk at a time; `changed` sees each chunk's
    /// changed jobs once it is committed.
    pub async fn bulk(
        &self,
        action: BulkAction,
        filter: &JobFilter,
        ids: Option<&[JobId]>,
        mut changed: impl FnMut(&[JobChange]),
    ) -> Result<BulkReport, StoreError> {
        let mut report = BulkReport::default();
        match ids {
            Some(ids) => {
                // Each job once, however often it is named (across chunks too).
                let mut ids = ids.to_vec();
                ids.sort_unstable_by_key(|id| std::cmp::Reverse(id.0));
                ids.dedup();
                for chunk in ids.chunks(BULK_CHUNK as usize) {
                    let chunk: Vec<Uuid> = chunk.iter().map(|id| id.0).collect();
                    let chunk = &chunk;
                    let rows = self
                        .timed("bulk", || async move {
                            let client = self.conn().await?;
                            let stmt = client.prepare_cached(sql::JOB_MATCH).await?;
                            Ok(client
                                .query(
                                    &stmt,
                                    &[
                                        &chunk,
                                        &filter.queue.as_str(),
                                        &filter.state_names(),
                                        &filter.created_before,
                                    ],
                                )
                                .await?)
                        })
                        .await?;
                    let matched: Vec<Uuid> = rows.iter().map(|r| col(r, "id")).collect::<Result<_, _>>()?;
                    self.bulk_chunk(action, filter, &matched, &mut report, &mut changed)
                        .await?;
                }
            }
            None => {
                let mut cursor = None;
                loop {
                    let matched = self.list_job_ids(filter, cursor, BULK_CHUNK).await?;
                    let Some(last) = matched.last() else { break };
                    cursor = Some(JobId(*last));
                    self.bulk_chunk(action, filter, &matched, &mut report, &mut changed)
                        .await?;
                    if (matched.len() as i64) < BULK_CHUNK {
                        break;
                    }
                }
            }
        }
        Ok(report)
    }

    /// Applies `action` to one chunk of the jobs `filter` matched, and counts
    /// it in `report`; `changed` sees the jobs it changed.
    async fn bulk_chunk(
        &self,
        action: BulkAction,
        filter: &JobFilter,
        matched: &[Uuid],
        report: &mut BulkReport,
        changed: &mut impl FnMut(&[JobChange]),
    ) -> Result<(), StoreError> {
        report.matched += matched.len() as u64;
        let done = self
            .apply_retrying(action, matched, &filter.state_names())
            .await?;
        report.changed += done.len() as u64;
        changed(&done);
        Ok(())
    }

    /// [`Store::apply`] for a bulk chunk: the filter's states re-checked on
    /// each locked row, and a deadlock (with a finish batch locking the same
    /// rows in another order) retried.
    async fn apply_retrying(
        &self,
        action: BulkAction,
        ids: &[Uuid],
        states: &[&str],
    ) -> Result<Vec<JobChange>, StoreError> {
        let mut tries = 0;
        loop {
            match self.apply(action, ids, Some(states)).await {
                Err(StoreError::Retry(detail)) if tries < 3 => {
                    tries += 1;
                    tracing::info!(%detail, tries, "bulk chunk met a transient conflict; retrying");
                }
                other => return other,
            }
        }
    }

    /// Runs `action`'s statement over `ids` (one transaction); answers the
    /// jobs it changed.
    pub(crate) async fn apply(
        &self,
        action: BulkAction,
        ids: &[Uuid],
        states: Option<&[&str]>,
    ) -> Result<Vec<JobChange>, StoreError> {
        let (changes, settled) = self
            .timed("bulk", || async move {
                if ids.is_empty() {
                    return Ok((Vec::new(), Vec::new()));
                }
                let client = self.conn().await?;
                let states: Option<Vec<&str>> = states.map(<[&str]>::to_vec);
                let (stmt, open, with_times) = match action {
                    BulkAction::Retry => (&sql::JOB_RETRY, Open::States, true),
                    BulkAction::Cancel => (&sql::JOB_CANCEL, Open::States, true),
                    BulkAction::Delete => (&sql::JOB_DELETE, Open::Deletes, false),
                };
                let tx = Tallied::new(&client);
                let outcome = async {
                    tx.begin(open).await?;
                    let rows = match action {
                        // The jobs, then their attempts, in one transaction.
                        BulkAction::Delete => delete_jobs(&tx, stmt, &[&ids, &states]).await?,
                        _ => tx.query(stmt, &[&ids, &states]).await?,
                    };
                    let changes = rows
                        .iter()
                        .map(|r| JobChange::from_row(r, with_times))
                        .collect::<Result<Vec<_>, _>>()?;
                    // Their dependents, settled in the same transaction.
                    let settled = dependencies::settle(&tx, ended_with_dependents(action, &rows)?).await?;
                    Ok((changes, settled))
                }
                .await;
                tx.end(outcome).await
            })
            .await?;
        self.report_settled(settled);
        Ok(changes)
    }
}

/// The jobs a bulk action's rows ended that have dependents to settle: a
/// job cancelled, or deleted while blocked (the dependents of a job deleted
/// after it ended were settled when it ended); none for a retry.
fn ended_with_dependents(
    action: BulkAction,
    rows: &[tokio_postgres::Row],
) -> Result<Vec<dependencies::Ended>, StoreError> {
    let how = match action {
        BulkAction::Retry => return Ok(Vec::new()),
        BulkAction::Cancel => "cancelled",
        BulkAction::Delete => "deleted",
    };
    let mut ended = Vec::new();
    for row in rows {
        let state: DbJobState = col(row, "state")?;
        let settles = match action {
            BulkAction::Delete => state.0 == JobState::Blocked,
            _ => state.0 == JobState::Cancelled,
        };
        if settles && col::<i32>(row, "dependents")? > 0 {
            ended.push((col(row, "id")?, how));
        }
    }
    Ok(ended)
}
