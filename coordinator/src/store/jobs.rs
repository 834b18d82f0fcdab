//! Producer operations: enqueue, read, cancel, admin retry.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use runlease_protocol::limits::MAX_DEPENDENTS_SHOWN;
use runlease_protocol::{JobId, JobState, QueueName, RunLease, TraceParent};
use serde_json::Value;
use uuid::Uuid;

use crate::store::claims::queued_by;
use crate::store::dependencies::{self, Dependencies, EnqueueColumns};
use crate::store::leases::ClaimGroup;
use crate::store::listing::BulkAction;
use crate::store::rows::ClaimedJob;
use crate::store::rows::{
    ATTEMPTS_ASKED, AttemptRow, JobColumns, JobRow, assemble, attempts_by_job, col, keep_latest, queue_col,
};
use crate::store::tally::{Open, Tallied};
use crate::store::{Store, StoreError, query_changes, sql};

/// A job to enqueue: validated, with the coordinator's defaults applied (by
/// the HTTP layer, from the protocol's enqueue request).
#[derive(Debug, Clone)]
pub struct NewJob {
    /// Minted by the coordinator (UUIDv7).
    pub id: JobId,
    /// Queue.
    pub queue: QueueName,
    /// Payload.
    pub payload: Value,
    /// Priority (smaller first).
    pub priority: i32,
    /// Due time, if given as an instant.
    pub run_at: Option<DateTime<Utc>>,
    /// Due time, if given as a delay.
    pub delay_ms: Option<i64>,
    /// Attempt budget (`None`: the queue's, else the coordinator's default).
    pub max_attempts: Option<i32>,
    /// Backoff fields the job sets (the others: the queue's, else the
    /// coordinator's defaults).
    pub backoff: runlease_protocol::Backoff,
    /// Retry window (`None`: the queue's, else none).
    pub retry_window_ms: Option<i64>,
    /// Attempt timeout, if the producer set one.
    pub timeout_ms: Option<i64>,
    /// Idempotency key.
    pub idempotency_key: Option<String>,
    /// Concurrency key.
    pub concurrency_key: Option<String>,
    /// The producer's W3C trace context.
    pub traceparent: Option<TraceParent>,
    /// What it waits for, if anything.
    pub dependencies: Option<Dependencies>,
}

/// A job answered by an enqueue: new, or the original of a repeated key.
#[derive(Debug, Clone)]
pub struct Enqueued {
    /// The job.
    pub job: JobRow,
    /// Whether this call created it.
    pub created: bool,
}

/// What a cancel did.
#[derive(Debug)]
pub enum CancelOutcome {
    /// Claimable job: now `cancelled`; or running job: cancel requested.
    Done(Box<JobRow>),
    /// No such job.
    NotFound,
    /// The job is terminal already.
    Terminal(JobState),
}

/// What an admin retry did.
#[derive(Debug)]
pub enum RetryOutcome {
    /// Back to `queued`.
    Done(Box<JobRow>),
    /// No such job.
    NotFound,
    /// Only failed and cancelled jobs can be retried.
    NotRetryable(JobState),
}

/// The jobs that hold the idempotency keys of `skipped` (jobs an enqueue
/// did not insert), with their chronology, by (queue, key).
async fn originals_of(
    tx: &deadpool_postgres::ClientWrapper,
    skipped: &[&NewJob],
) -> Result<HashMap<(String, String), JobRow>, StoreError> {
    let mut originals = HashMap::new();
    if skipped.is_empty() {
        return Ok(originals);
    }
    let q: Vec<&str> = skipped.iter().map(|j| j.queue.as_str()).collect();
    let k: Vec<&str> = skipped
        .iter()
        .filter_map(|j| j.idempotency_key.as_deref())
        .collect();
    let stmt = tx.prepare_cached(sql::JOB_GET_BY_IDEMPOTENCY_KEY).await?;
    let records = JobRow::from_rows(&tx.query(&stmt, &[&q, &k]).await?)?;
    let ids: Vec<Uuid> = records.iter().map(|r| r.id.0).collect();
    let stmt = tx.prepare_cached(sql::ATTEMPT_LIST).await?;
    let attempts = attempts_by_job(&tx.query(&stmt, &[&ids, &ATTEMPTS_ASKED]).await?)?;
    for job in assemble(records, &attempts) {
        let key = job.idempotency_key.clone().unwrap_or_default();
        originals.insert((job.queue.to_string(), key), job);
    }
    Ok(originals)
}

/// Runs `job_enqueue.sql` for `jobs` in `tx`, with the dependency
/// columns where some job has dependencies, and the idempotency arbiter
/// where some job has a key. A column no job sets is sent as one NULL
/// (`unnest` reads it as NULL for every job) rather than an array of NULLs.
async fn insert_jobs(
    tx: &Tallied<'_>,
    jobs: &[NewJob],
    deps: Option<&EnqueueColumns>,
    default_attempts: i32,
) -> Result<Vec<JobRow>, StoreError> {
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.id.0).collect();
    let queues: Vec<&str> = jobs.iter().map(|j| j.queue.as_str()).collect();
    let payloads: Vec<&Value> = jobs.iter().map(|j| &j.payload).collect();
    let priorities: Vec<i32> = jobs.iter().map(|j| j.priority).collect();
    let run_at = column(jobs, |j| j.run_at);
    let delays = column(jobs, |j| j.delay_ms);
    let max_attempts = column(jobs, |j| j.max_attempts);
    let bases = column(jobs, |j| j.backoff.base_ms);
    let maxes = column(jobs, |j| j.backoff.max_ms);
    let factors = column(jobs, |j| j.backoff.factor);
    let jitters = column(jobs, |j| j.backoff.jitter);
    let windows = column(jobs, |j| j.retry_window_ms);
    let timeouts = column(jobs, |j| j.timeout_ms);
    let keys = column(jobs, |j| j.idempotency_key.as_deref());
    let concurrency = column(jobs, |j| j.concurrency_key.as_deref());
    let traceparents = column(jobs, |j| j.traceparent.as_ref().map(TraceParent::as_str));
    let statement = if keys.is_some() {
        &sql::JOB_ENQUEUE_KEYED
    } else {
        &sql::JOB_ENQUEUE
    };
    // Each row is read as a job as it arrives, while the insert goes on.
    let mut columns: Option<JobColumns> = None;
    let read = move |names: &[tokio_postgres::Column], row: &tokio_postgres::Row| {
        let columns = match &columns {
            Some(c) => c,
            None => columns.insert(JobColumns::of(names)?),
        };
        JobRow::read(row, columns)
    };
    tx.query_each(
        statement,
        &[
            &ids,
            &queues,
            &payloads,
            &priorities,
            &run_at,
            &delays,
            &max_attempts,
            &timeouts,
            &keys,
            &concurrency,
            &traceparents,
            &deps.map(|d| &d.states),
            &deps.map(|d| &d.dependencies),
            &deps.map(|d| &d.pending),
            &deps.map(|d| &d.dependents),
            &deps.map(|d| &d.on_failure),
            &deps.map(|d| &d.errors),
            &default_attempts,
            &bases,
            &maxes,
            &factors,
            &jitters,
            &windows,
        ],
        read,
    )
    .await
}

/// How an enqueue's transaction opens: [`Open::Inserts`] unless the
/// dependencies' statements, planned by what they are given, run in it.
fn opening(jobs: &[NewJob]) -> Open {
    if jobs.iter().any(|j| j.dependencies.is_some()) {
        Open::States
    } else {
        Open::Inserts
    }
}

/// One optional field of every job, as an array parameter: `None` (SQL
/// NULL) when no job sets it.
fn column<'a, T>(jobs: &'a [NewJob], field: impl Fn(&'a NewJob) -> Option<T>) -> Option<Vec<Option<T>>> {
    let values: Vec<Option<T>> = jobs.iter().map(field).collect();
    values.iter().any(Option::is_some).then_some(values)
}

/// A job of the enqueue that was inserted and depends on an earlier job of
/// the same enqueue that was skipped for its idempotency key (its edge
/// would name a job that was never written): their positions.
fn skipped_dependency(
    ids: &[JobId],
    edges: &(Vec<Uuid>, Vec<Uuid>),
    row_of: &[Option<usize>],
) -> Option<(usize, usize)> {
    let position = |id: &Uuid| ids.iter().position(|j| j.0 == *id);
    edges.0.iter().zip(&edges.1).find_map(|(dependent, dependency)| {
        let (d, k) = (position(dependent)?, position(dependency)?);
        (row_of[d].is_some() && row_of[k].is_none()).then_some((d, k))
    })
}

/// What an enqueue's transaction wrote.
struct Written {
    /// The jobs inserted, as their rows came.
    rows: Vec<JobRow>,
    /// Each job's row, in request order; `None`: skipped for its
    /// idempotency key.
    row_of: Vec<Option<usize>>,
    /// The originals of the jobs skipped, by (queue, key).
    originals: HashMap<(String, String), JobRow>,
}

/// The row of each job (`ids`, in request order) among an insert's rows.
fn rows_of(ids: &[JobId], rows: &[JobRow]) -> Result<Vec<Option<usize>>, StoreError> {
    let position: HashMap<JobId, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut row_of = vec![None; ids.len()];
    for (r, row) in rows.iter().enumerate() {
        let at = *position.get(&row.id).ok_or_else(|| {
            StoreError::Database(format!(
                "the enqueue answered job {}, which it was not given",
                row.id
            ))
        })?;
        row_of[at] = Some(r);
    }
    Ok(row_of)
}

impl Written {
    /// Each job as answered: the row inserted, or the original its key
    /// named.
    fn answers(self, jobs: &[NewJob]) -> Result<Vec<Enqueued>, StoreError> {
        let mut rows: Vec<Option<JobRow>> = self.rows.into_iter().map(Some).collect();
        jobs.iter()
            .zip(&self.row_of)
            .map(|(j, row)| {
                if let Some(job) = row.and_then(|r| rows[r].take()) {
                    return Ok(Enqueued { job, created: true });
                }
                let key = (j.queue.to_string(), j.idempotency_key.clone().unwrap_or_default());
                self.originals
                    .get(&key)
                    .cloned()
                    .map(|job| Enqueued { job, created: false })
                    .ok_or_else(|| {
                        StoreError::Database(format!(
                            "job {} was neither inserted nor found by its key",
                            j.id
                        ))
                    })
            })
            .collect()
    }
}

/// What [`Store::enqueue_then_claim`] answers: the jobs, and each claim's
/// leases with the slot each filled (`None`: claimed, then given back).
pub type EnqueuedAndClaimed = (Vec<Enqueued>, Option<Vec<Vec<(usize, ClaimedJob)>>>);

impl Store {
    /// Enqueues jobs in one transaction, answering them in request order.
    /// Jobs whose idempotency key exists answer the original. A job with
    /// dependencies starts `blocked`, `queued` (all of them ended, met) or
    /// `cancelled` (one failed already): its existing dependencies are
    /// locked and read first (store::dependencies).
    pub async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>, StoreError> {
        self.enqueue_then(jobs, |enqueued| enqueued).await
    }

    /// [`Store::enqueue`], answering what `then` makes of the jobs while
    /// their COMMIT travels ([`Tallied::end_then`]): `then` must only make
    /// a value, and may run again when the enqueue is retried.
    pub async fn enqueue_then<T>(
        &self,
        jobs: &[NewJob],
        then: impl Fn(Vec<Enqueued>) -> T,
    ) -> Result<T, StoreError> {
        let then = &then;
        self.timed("enqueue", || async move {
            let client = self.conn().await?;
            let tx = Tallied::new(&client);
            // BEGIN and the enqueue's first statement in one round trip.
            let (begun, written) = tokio::join!(tx.begin(opening(jobs)), self.enqueue_in(&tx, jobs));
            // The rows are read as jobs before the COMMIT (as they arrive): a
            // row that cannot be read rolls the enqueue back rather than
            // answer an error for jobs that were written.
            let answers = begun.and(written).and_then(|w| w.answers(jobs));
            tx.end_then(answers, then).await
        })
        .await
    }

    /// [`Store::enqueue`] and, in the same transaction after the jobs are
    /// written, a claim for each of `claims` (queues without flow-control
    /// limits, as the shared statement of [`Store::claim`]): claimers parked
    /// for the queues the jobs go to are served by the enqueue that made
    /// their jobs, one commit for both. Each claim's scans start no higher
    /// than the first new job of their queue. Answers the jobs in request
    /// order and each claim's leases (with the slot, 0-based, each filled),
    /// or an error for all: nothing of a failed transaction stands. Should
    /// the leases' dependencies not be read after the commit, the leases
    /// are given back and answered as `None` (the jobs stand).
    pub async fn enqueue_then_claim(
        &self,
        jobs: &[NewJob],
        claims: &[ClaimGroup<'_>],
    ) -> Result<EnqueuedAndClaimed, StoreError> {
        self.timed("enqueue", || async move {
            let client = self.conn().await?;
            let tx = Tallied::new(&client);
            let (begun, written) = tokio::join!(tx.begin(opening(jobs)), self.enqueue_in(&tx, jobs));
            let head = async {
                let answers = begun.and(written).and_then(|w| w.answers(jobs))?;
                // The new jobs were written after the floors were read, and
                // their wake-up comes after the commit: the claims' floors
                // must not pass them.
                let new = queued_by(&answers);
                let send = self.prepare_claims(&tx, claims, Some(&new)).await?;
                Ok::<_, StoreError>((answers, send))
            };
            let (answers, send) = tx.or_roll_back(head.await).await?;
            // The claims' settings, the claims, the tallies and the COMMIT
            // in one round trip (each future sends at its first poll).
            let sent = async {
                let (planned, claimed) = tokio::join!(tx.set(sql::CLAIM_PLANNING), send.send(&tx, false));
                planned?;
                claimed
            };
            let rows = tx.commit_behind(sent).await?;
            // The jobs stand whatever follows: leases whose rows cannot be
            // read run until they expire; those whose dependencies cannot
            // be read are given back.
            let committed = async {
                let (mut claimed, found) = rows.read()?;
                self.claims_committed(&client, claims, &mut claimed, (send.into_taken(), found))
                    .await?;
                Ok::<_, StoreError>(claimed)
            };
            match committed.await {
                Ok(claimed) => Ok((answers, Some(claimed))),
                Err(e) => {
                    tracing::warn!(error = %e, "the leases of an enqueue's claims were not answered");
                    Ok((answers, None))
                }
            }
        })
        .await
    }

    /// [`Store::enqueue`] in `tx`, up to its COMMIT.
    async fn enqueue_in(&self, tx: &Tallied<'_>, jobs: &[NewJob]) -> Result<Written, StoreError> {
        let ids: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
        let deps: Vec<Option<&Dependencies>> = jobs.iter().map(|j| j.dependencies.as_ref()).collect();
        let with_deps = deps.iter().any(Option::is_some);
        let columns = if with_deps {
            let (lock, counts) = dependencies::existing_of(&deps);
            let existing = dependencies::lock_existing(tx, &lock, &counts).await?;
            Some(EnqueueColumns::new(
                &ids,
                &deps,
                dependencies::plan(&ids, &deps, &existing),
            ))
        } else {
            None
        };
        let rows = insert_jobs(
            tx,
            jobs,
            columns.as_ref(),
            self.lease_settings().default_max_attempts,
        )
        .await?;
        let row_of = rows_of(&ids, &rows)?;
        if let Some(c) = &columns
            && !c.edges.0.is_empty()
        {
            if let Some((dependent, dependency)) = skipped_dependency(&ids, &c.edges, &row_of) {
                // Nothing is written: the transaction rolls back.
                return Err(StoreError::Rejected(format!(
                    "jobs[{dependent}] depends on jobs[{dependency}], whose idempotency key names a job that already exists: \
                     name that job's id in depends_on instead"
                )));
            }
            let made: Vec<Uuid> = ids
                .iter()
                .zip(&row_of)
                .filter_map(|(id, row)| row.map(|_| id.0))
                .collect();
            let stmt = tx.client().prepare_cached(sql::JOB_DEPENDENCIES_INSERT).await?;
            tx.client()
                .execute(&stmt, &[&c.edges.0, &c.edges.1, &made])
                .await?;
        }
        // Jobs skipped for an existing idempotency key: read the originals.
        let skipped: Vec<&NewJob> = jobs
            .iter()
            .zip(&row_of)
            .filter_map(|(j, row)| row.is_none().then_some(j))
            .collect();
        let originals = originals_of(tx.client(), &skipped).await?;
        Ok(Written {
            rows,
            row_of,
            originals,
        })
    }

    /// Marks jobs `enqueue_failed` (their wake-up did not go out); returns
    /// those still `queued` that were marked.
    pub async fn mark_enqueue_failed(&self, ids: &[JobId]) -> Result<Vec<(JobId, QueueName)>, StoreError> {
        self.timed("mark_enqueue_failed", || async move {
            let client = self.conn().await?;
            let ids: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
            let rows = query_changes(&client, &sql::JOB_MARK_ENQUEUE_FAILED, &[&ids]).await?;
            rows.iter()
                .map(|r| Ok((JobId(col(r, "id")?), queue_col(r, "queue")?)))
                .collect()
        })
        .await
    }

    /// One repair pass over up to `limit` `enqueue_failed` jobs: locks them,
    /// calls `publish` with their queues, and moves them to `queued` only if
    /// it returns true; otherwise nothing changes. Returns the queue of each
    /// repaired job.
    pub async fn repair_enqueue_failed<F, Fut>(
        &self,
        limit: i64,
        publish: F,
    ) -> Result<Vec<QueueName>, StoreError>
    where
        F: Fn(Vec<QueueName>) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let publish = &publish;
        // The publish runs inside (bounded by its own Redis timeout).
        self.timed("repair", || async move {
            let client = self.conn().await?;
            let tx = Tallied::new(&client);
            let outcome = async {
                tx.begin(Open::States).await?;
                let stmt = client.prepare_cached(sql::JOB_REPAIR_PICK).await?;
                let rows = client.query(&stmt, &[&limit]).await?;
                if rows.is_empty() {
                    return Ok(Vec::new());
                }
                let mut ids = Vec::with_capacity(rows.len());
                let mut queues: Vec<QueueName> = Vec::new();
                for row in &rows {
                    ids.push(col::<Uuid>(row, "id")?);
                    let queue = queue_col(row, "queue")?;
                    if !queues.contains(&queue) {
                        queues.push(queue);
                    }
                }
                if !publish(queues).await {
                    // Nothing changes; the rows are freed at the end.
                    return Ok(Vec::new());
                }
                let repaired = tx.query(&sql::JOB_REPAIR_REQUEUE, &[&ids]).await?;
                repaired.iter().map(|r| queue_col(r, "queue")).collect()
            }
            .await;
            tx.end(outcome).await
        })
        .await
    }

    /// One dispatch pass over `queue`: marks up to `limit` due jobs whose due
    /// time was not signalled, then calls `send` with their number (no row
    /// lock is held while it runs, so woken workers can claim at once). When
    /// `send` returns false the marks are given back for the next pass.
    /// Returns how many jobs were signalled.
    pub async fn dispatch_due<F, Fut>(
        &self,
        queue: &QueueName,
        limit: i64,
        send: F,
    ) -> Result<usize, StoreError>
    where
        F: FnOnce(usize) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        // Only the statements are under the deadline, not the send: a send
        // cut short would leave jobs marked but never signalled.
        let rows = self
            .timed("dispatch", || async move {
                let client = self.conn().await?;
                let stmt = client.prepare_cached(sql::JOB_DISPATCH_PICK).await?;
                Ok(client.query(&stmt, &[&queue.as_str(), &limit]).await?)
            })
            .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        let ids: Vec<Uuid> = rows.iter().map(|r| col(r, "id")).collect::<Result<_, _>>()?;
        let due: Vec<DateTime<Utc>> = rows.iter().map(|r| col(r, "run_at")).collect::<Result<_, _>>()?;
        if send(ids.len()).await {
            return Ok(ids.len());
        }
        let (ids, due) = (&ids, &due);
        self.timed("dispatch", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::JOB_DISPATCH_UNMARK).await?;
            client.execute(&stmt, &[&ids, &due]).await?;
            Ok(0)
        })
        .await
    }

    /// Reads jobs with their chronology, in no particular order; missing ids are absent.
    pub async fn get_jobs(&self, ids: &[JobId]) -> Result<Vec<JobRow>, StoreError> {
        self.timed("get_jobs", || async move {
            let client = self.conn().await?;
            let ids: Vec<Uuid> = ids.iter().map(|id| id.0).collect();
            let stmt = client.prepare_cached(sql::JOB_GET).await?;
            let records = JobRow::from_rows(&client.query(&stmt, &[&ids]).await?)?;
            let stmt = client.prepare_cached(sql::ATTEMPT_LIST).await?;
            let attempts = attempts_by_job(&client.query(&stmt, &[&ids, &ATTEMPTS_ASKED]).await?)?;
            let mut jobs = assemble(records, &attempts);
            let most = i32::try_from(MAX_DEPENDENTS_SHOWN).unwrap_or(i32::MAX);
            dependencies::attach_links(&client, &mut jobs, most).await?;
            Ok(jobs)
        })
        .await
    }

    /// A page of one job's ended attempts: at most `limit` of those before
    /// `before`, oldest first, and whether earlier ones exist.
    pub async fn attempt_page(
        &self,
        id: JobId,
        before: RunLease,
        limit: u32,
    ) -> Result<(Vec<AttemptRow>, bool), StoreError> {
        let asked = i64::from(limit) + 1;
        self.timed("attempt_page", || async move {
            let client = self.conn().await?;
            let stmt = client.prepare_cached(sql::ATTEMPT_PAGE).await?;
            let rows = client.query(&stmt, &[&id.0, &before.0, &asked]).await?;
            let page = attempts_by_job(&rows)?.remove(&id).unwrap_or_default();
            let (earlier, kept) = keep_latest(&page, limit as usize);
            Ok((kept.to_vec(), earlier))
        })
        .await
    }

    /// Reads one job with its chronology.
    pub async fn get_job(&self, id: JobId) -> Result<Option<JobRow>, StoreError> {
        Ok(self.get_jobs(&[id]).await?.pop())
    }

    /// Cancels a job (see `sql/job_cancel.sql`).
    pub async fn cancel(&self, id: JobId) -> Result<CancelOutcome, StoreError> {
        let changed = self.apply(BulkAction::Cancel, &[id.0], None).await?;
        let Some(job) = self.get_job(id).await? else {
            return Ok(CancelOutcome::NotFound);
        };
        // A running job whose cancel was requested before answers as it is.
        if !changed.is_empty() || job.state == JobState::Running {
            return Ok(CancelOutcome::Done(Box::new(job)));
        }
        Ok(CancelOutcome::Terminal(job.state))
    }

    /// Puts a failed or cancelled job back on its queue (see `sql/job_retry.sql`).
    pub async fn retry(&self, id: JobId) -> Result<RetryOutcome, StoreError> {
        let changed = self.apply(BulkAction::Retry, &[id.0], None).await?;
        Ok(match self.get_job(id).await? {
            None => RetryOutcome::NotFound,
            Some(job) if !changed.is_empty() => RetryOutcome::Done(Box::new(job)),
            Some(job) => RetryOutcome::NotRetryable(job.state),
        })
    }
}
