//! Job dependencies: how the jobs of an enqueue start given theirs, the
//! settling of dependents in the transaction that ends their dependencies,
//! and the look-ups of a lease and of a job answer.
//!
//! A job with dependencies that have not all ended is `blocked`. The
//! transaction that ends a dependency (a finish, a reap, a cancel, a
//! delete) settles its blocked dependents with the statement after the one
//! that ended it (`job_dependents_settled.sql`, ADR 030). Only jobs
//! whose `dependents` column is not 0 are looked at, so jobs without
//! dependents pay for nothing; a claim looks dependencies up only for jobs
//! whose `dependencies` column is not 0.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use runlease_protocol::{JobId, JobState, OnDependencyFailure, QueueName};
use serde_json::Value;
use uuid::Uuid;

use crate::store::rows::{ClaimedJob, DbJobState, JobRow, col, queue_col};
use crate::store::tally::Tallied;
use crate::store::{StoreError, sql};

/// One dependency of a job to enqueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DependsOn {
    /// An earlier job of the same enqueue, by its index.
    Earlier(usize),
    /// A job that exists already (or did: a deleted one fails).
    Existing(JobId),
}

/// The dependencies of a job to enqueue: each named once, at most
/// [`runlease_protocol::limits::MAX_DEPENDENCIES`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dependencies {
    /// What it waits for.
    pub on: Vec<DependsOn>,
    /// What a failed dependency does to it.
    pub on_failure: OnDependencyFailure,
}

/// How a job of an enqueue starts, given its dependencies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Claimable: no dependencies, or all of them ended (met, or failed
    /// under `run`).
    Queued,
    /// Waiting for `pending` dependencies to end.
    Blocked {
        /// Dependencies not ended yet.
        pending: i32,
    },
    /// A dependency failed already and the job's policy is `cancel`.
    Cancelled {
        /// Names the dependency.
        error: String,
    },
}

impl Start {
    /// The state it enters, as `job_enqueue.sql` takes it.
    fn state(&self) -> &'static str {
        match self {
            Start::Queued => "queued",
            Start::Blocked { .. } => "blocked",
            Start::Cancelled { .. } => "cancelled",
        }
    }
}

/// Why a dependency counts as failed, in the words of a cancelled job's
/// error (the same as `job_dependents_settle.sql` writes).
fn failure(id: JobId, state: Option<JobState>) -> String {
    match state {
        Some(JobState::Cancelled) => format!("dependency {id} was cancelled"),
        None => format!("dependency {id} was deleted"),
        _ => format!("dependency {id} failed"),
    }
}

/// How each job of an enqueue starts, in order: `ids` are the jobs' ids,
/// `existing` the state now of each existing dependency (read under its
/// row lock; absent: no such job, which counts as deleted). A dependency on
/// an earlier job of the enqueue is pending, unless that job is cancelled
/// at once (then it failed).
pub fn plan(
    ids: &[JobId],
    deps: &[Option<&Dependencies>],
    existing: &HashMap<JobId, JobState>,
) -> Vec<Start> {
    let mut starts: Vec<Start> = Vec::with_capacity(deps.len());
    for d in deps {
        let Some(d) = d else {
            starts.push(Start::Queued);
            continue;
        };
        let mut pending = 0;
        let mut failed: Option<String> = None;
        for on in &d.on {
            let state = match *on {
                DependsOn::Earlier(k) => match starts.get(k) {
                    Some(Start::Cancelled { .. }) => Err(failure(ids[k], Some(JobState::Cancelled))),
                    _ => Ok(false),
                },
                DependsOn::Existing(id) => match existing.get(&id) {
                    Some(JobState::Done) => Ok(true),
                    Some(s @ (JobState::Failed | JobState::Cancelled)) => Err(failure(id, Some(*s))),
                    Some(_) => Ok(false),
                    None => Err(failure(id, None)),
                },
            };
            match state {
                Ok(true) => {}
                Ok(false) => pending += 1,
                Err(why) => {
                    failed.get_or_insert(why);
                }
            }
        }
        starts.push(match (failed, d.on_failure) {
            (Some(error), OnDependencyFailure::Cancel) => Start::Cancelled { error },
            _ if pending > 0 => Start::Blocked { pending },
            _ => Start::Queued,
        });
    }
    starts
}

/// The columns `job_enqueue.sql` takes for the dependencies of its jobs
/// (parallel arrays, one element per job).
#[derive(Debug, Default)]
pub struct EnqueueColumns {
    /// Each job's first state.
    pub states: Vec<&'static str>,
    /// Its dependencies.
    pub dependencies: Vec<i32>,
    /// Of those, not ended yet.
    pub pending: Vec<i32>,
    /// Later jobs of the enqueue that depend on it.
    pub dependents: Vec<i32>,
    /// Its policy, if it has dependencies.
    pub on_failure: Vec<Option<&'static str>>,
    /// The error of a job cancelled at once.
    pub errors: Vec<Option<String>>,
    /// The edges: (dependent, dependency).
    pub edges: (Vec<Uuid>, Vec<Uuid>),
}

impl EnqueueColumns {
    /// The columns of jobs `ids` with `deps`, starting as `starts` says.
    pub fn new(ids: &[JobId], deps: &[Option<&Dependencies>], starts: Vec<Start>) -> Self {
        let n = ids.len();
        let mut c = Self {
            dependents: vec![0; n],
            ..Self::default()
        };
        for (i, (d, start)) in deps.iter().zip(starts).enumerate() {
            let count = d.map_or(0, |d| d.on.len());
            c.states.push(start.state());
            c.dependencies.push(i32::try_from(count).unwrap_or(i32::MAX));
            c.pending.push(match start {
                Start::Blocked { pending } => pending,
                _ => 0,
            });
            c.on_failure.push(d.map(|d| d.on_failure.as_str()));
            c.errors.push(match start {
                Start::Cancelled { error } => Some(error),
                _ => None,
            });
            for on in d.map_or(&[][..], |d| &d.on[..]) {
                let target = match *on {
                    DependsOn::Earlier(k) => {
                        if let Some(count) = c.dependents.get_mut(k) {
                            *count += 1;
                        }
                        ids[k]
                    }
                    DependsOn::Existing(id) => id,
                };
                c.edges.0.push(ids[i].0);
                c.edges.1.push(target.0);
            }
        }
        c
    }
}

/// The existing jobs `deps` name, each once in id order, with how many of
/// the enqueue's jobs depend on it (the parameters of
/// `job_dependencies_lock.sql`).
pub fn existing_of(deps: &[Option<&Dependencies>]) -> (Vec<Uuid>, Vec<i32>) {
    let mut counts: std::collections::BTreeMap<Uuid, i32> = std::collections::BTreeMap::new();
    for d in deps.iter().flatten() {
        for on in &d.on {
            if let DependsOn::Existing(id) = on {
                *counts.entry(id.0).or_default() += 1;
            }
        }
    }
    counts.into_iter().unzip()
}

/// Locks the existing dependencies of an enqueue (in `tx`) and answers
/// each one's state now; a missing id names no job.
pub async fn lock_existing(
    tx: &Tallied<'_>,
    ids: &[Uuid],
    counts: &[i32],
) -> Result<HashMap<JobId, JobState>, StoreError> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let stmt = tx.client().prepare_cached(sql::JOB_DEPENDENCIES_LOCK).await?;
    let rows = tx.client().query(&stmt, &[&ids, &counts]).await?;
    rows.iter()
        .map(|r| Ok((JobId(col(r, "id")?), col::<DbJobState>(r, "state")?.0)))
        .collect()
}

/// A job whose dependencies settled: queued, or cancelled by a failed one.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    /// The job.
    pub job_id: JobId,
    /// Its queue.
    pub queue: QueueName,
    /// `queued` or `cancelled`.
    pub state: JobState,
    /// When it was enqueued.
    pub created_at: DateTime<Utc>,
    /// When it was cancelled.
    pub finished_at: Option<DateTime<Utc>>,
    /// Whether it carries trace context.
    pub traced: bool,
}

impl Settled {
    /// Reads a row of `settled` (job_dependents_settle.sql); `None` for a
    /// job still blocked.
    pub fn from_row(row: &tokio_postgres::Row) -> Result<Option<Self>, StoreError> {
        let state = col::<DbJobState>(row, "state")?.0;
        if state == JobState::Blocked {
            return Ok(None);
        }
        Ok(Some(Self {
            job_id: JobId(col(row, "id")?),
            queue: queue_col(row, "queue")?,
            state,
            created_at: col(row, "created_at")?,
            finished_at: col(row, "finished_at")?,
            traced: col(row, "traced")?,
        }))
    }
}

/// A job ended by a statement, whose dependents are to be settled: its id
/// and how it ended (`done`, `failed`, `cancelled` or `deleted`).
pub type Ended = (Uuid, &'static str);

/// How a job in `state` ended, for its dependents.
pub fn ended_as(state: JobState) -> &'static str {
    match state {
        JobState::Done => "done",
        JobState::Failed => "failed",
        _ => "cancelled",
    }
}

/// The jobs of `rows` (answered with `id`, `state` and `dependents`) that
/// cancelled with dependents of their own: the next level to settle.
fn cancelled_with_dependents(rows: &[tokio_postgres::Row]) -> Result<Vec<Ended>, StoreError> {
    let mut next = Vec::new();
    for row in rows {
        let state = col::<DbJobState>(row, "state")?.0;
        if state == JobState::Cancelled && col::<i32>(row, "dependents")? > 0 {
            next.push((col(row, "id")?, "cancelled"));
        }
    }
    Ok(next)
}

/// Settles, in `tx`, the dependents of `ended` (jobs an earlier statement
/// of `tx` ended, each with dependents), and theirs in turn where it
/// cancels them, a level per statement; answers every job it queued or
/// cancelled. The graph has no cycles, so the levels end.
pub async fn settle(tx: &Tallied<'_>, mut ended: Vec<Ended>) -> Result<Vec<Settled>, StoreError> {
    let mut settled = Vec::new();
    while !ended.is_empty() {
        let ids: Vec<Uuid> = ended.iter().map(|(id, _)| *id).collect();
        let how: Vec<&str> = ended.iter().map(|(_, how)| *how).collect();
        let rows = tx.query(&sql::JOB_DEPENDENTS_SETTLED, &[&ids, &how]).await?;
        for row in &rows {
            settled.extend(Settled::from_row(row)?);
        }
        ended = cancelled_with_dependents(&rows)?;
    }
    Ok(settled)
}

/// The jobs `lease_finish.sql` ended (its `rows`) that have dependents:
/// the next statement of its transaction settles those ([`settle`]).
pub fn ended_by_finish(rows: &[tokio_postgres::Row]) -> Result<Vec<Ended>, StoreError> {
    let mut ended = Vec::new();
    for row in rows {
        if col::<i32>(row, "dependents")? == 0 {
            continue;
        }
        let state = col::<DbJobState>(row, "state")?.0;
        if matches!(state, JobState::Done | JobState::Failed | JobState::Cancelled) {
            ended.push((col(row, "id")?, ended_as(state)));
        }
    }
    Ok(ended)
}

/// One dependency of a leased job.
#[derive(Debug, Clone, PartialEq)]
pub struct DependencyRow {
    /// The dependency.
    pub id: JobId,
    /// Its state (`None`: deleted).
    pub state: Option<JobState>,
    /// Its result.
    pub result: Option<Value>,
}

/// Fills the `dependencies` of the claimed jobs that have some (one
/// look-up for all of them; none when no job has any).
pub async fn attach_to_leases(
    client: &deadpool_postgres::ClientWrapper,
    jobs: &mut [&mut ClaimedJob],
) -> Result<(), StoreError> {
    let ids: Vec<Uuid> = jobs
        .iter()
        .filter(|j| j.has_dependencies && j.dependencies.is_empty())
        .map(|j| j.id.0)
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    let stmt = client.prepare_cached(sql::JOB_DEPENDENCIES_OF).await?;
    let mut by_job: HashMap<Uuid, Vec<DependencyRow>> = HashMap::new();
    for row in client.query(&stmt, &[&ids]).await? {
        let state: Option<DbJobState> = col(&row, "state")?;
        by_job
            .entry(col(&row, "job_id")?)
            .or_default()
            .push(DependencyRow {
                id: JobId(col(&row, "id")?),
                state: state.map(|s| s.0),
                result: col(&row, "result")?,
            });
    }
    for job in jobs.iter_mut() {
        if let Some(deps) = by_job.remove(&job.id.0) {
            job.dependencies = deps;
        }
    }
    Ok(())
}

/// A job linked to another by a dependency, with its state now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The other job.
    pub id: JobId,
    /// Its state (`None`: deleted).
    pub state: Option<JobState>,
}

/// Fills the dependencies and dependents (at most `most` of these) of the
/// jobs that have any: a look-up each, only when some job has them.
pub async fn attach_links(
    client: &deadpool_postgres::ClientWrapper,
    jobs: &mut [JobRow],
    most: i32,
) -> Result<(), StoreError> {
    let with_deps: Vec<Uuid> = jobs
        .iter()
        .filter(|j| j.dependency_count > 0)
        .map(|j| j.id.0)
        .collect();
    let with_dependents: Vec<Uuid> = jobs
        .iter()
        .filter(|j| j.dependent_count > 0)
        .map(|j| j.id.0)
        .collect();
    let mut deps: HashMap<Uuid, Vec<Link>> = HashMap::new();
    let mut dependents: HashMap<Uuid, Vec<Link>> = HashMap::new();
    if !with_deps.is_empty() {
        let stmt = client.prepare_cached(sql::JOB_DEPENDENCIES_OF).await?;
        for row in client.query(&stmt, &[&with_deps]).await? {
            let state: Option<DbJobState> = col(&row, "state")?;
            deps.entry(col(&row, "job_id")?).or_default().push(Link {
                id: JobId(col(&row, "id")?),
                state: state.map(|s| s.0),
            });
        }
    }
    if !with_dependents.is_empty() {
        let stmt = client.prepare_cached(sql::JOB_DEPENDENTS_OF).await?;
        for row in client.query(&stmt, &[&with_dependents, &most]).await? {
            let state: Option<DbJobState> = col(&row, "state")?;
            dependents
                .entry(col(&row, "depends_on_id")?)
                .or_default()
                .push(Link {
                    id: JobId(col(&row, "id")?),
                    state: state.map(|s| s.0),
                });
        }
    }
    for job in jobs.iter_mut() {
        job.dependencies = deps.remove(&job.id.0).unwrap_or_default();
        job.dependents = dependents.remove(&job.id.0).unwrap_or_default();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(n: usize) -> Vec<JobId> {
        (0..n).map(|_| JobId::new()).collect()
    }

    fn on(list: Vec<DependsOn>, on_failure: OnDependencyFailure) -> Dependencies {
        Dependencies { on: list, on_failure }
    }

    #[test]
    fn a_chain_in_one_batch_blocks_all_but_the_first() {
        let ids = ids(3);
        let b = on(vec![DependsOn::Earlier(0)], OnDependencyFailure::Cancel);
        let c = on(vec![DependsOn::Earlier(1)], OnDependencyFailure::Cancel);
        let deps = [None, Some(&b), Some(&c)];
        let starts = plan(&ids, &deps, &HashMap::new());
        assert_eq!(
            starts,
            [
                Start::Queued,
                Start::Blocked { pending: 1 },
                Start::Blocked { pending: 1 }
            ]
        );
        let cols = EnqueueColumns::new(&ids, &deps, starts);
        assert_eq!(cols.states, ["queued", "blocked", "blocked"]);
        assert_eq!(cols.dependents, [1, 1, 0]);
        assert_eq!(cols.dependencies, [0, 1, 1]);
        assert_eq!(cols.on_failure, [None, Some("cancel"), Some("cancel")]);
        assert_eq!(cols.edges.0, [ids[1].0, ids[2].0]);
        assert_eq!(cols.edges.1, [ids[0].0, ids[1].0]);
    }

    #[test]
    fn existing_dependencies_count_as_their_state_says() {
        let ids = ids(4);
        let (done, failed, running, gone) = (JobId::new(), JobId::new(), JobId::new(), JobId::new());
        let existing = HashMap::from([
            (done, JobState::Done),
            (failed, JobState::Failed),
            (running, JobState::Running),
        ]);
        let met = on(vec![DependsOn::Existing(done)], OnDependencyFailure::Cancel);
        let waits = on(
            vec![DependsOn::Existing(done), DependsOn::Existing(running)],
            OnDependencyFailure::Cancel,
        );
        let cancelled = on(
            vec![DependsOn::Existing(running), DependsOn::Existing(failed)],
            OnDependencyFailure::Cancel,
        );
        let runs = on(
            vec![DependsOn::Existing(gone), DependsOn::Existing(failed)],
            OnDependencyFailure::Run,
        );
        let deps = [Some(&met), Some(&waits), Some(&cancelled), Some(&runs)];
        let starts = plan(&ids, &deps, &existing);
        assert_eq!(starts[0], Start::Queued);
        assert_eq!(starts[1], Start::Blocked { pending: 1 });
        assert_eq!(
            starts[2],
            Start::Cancelled {
                error: format!("dependency {failed} failed")
            }
        );
        assert_eq!(starts[3], Start::Queued);
        let (lock, counts) = existing_of(&deps);
        let mut expected = vec![done.0, failed.0, running.0, gone.0];
        expected.sort();
        assert_eq!(lock, expected);
        assert_eq!(counts.iter().sum::<i32>(), 7);
    }

    #[test]
    fn a_job_cancelled_at_once_fails_its_dependents_in_the_batch() {
        let ids = ids(3);
        let gone = JobId::new();
        let a = on(vec![DependsOn::Existing(gone)], OnDependencyFailure::Cancel);
        let b = on(vec![DependsOn::Earlier(0)], OnDependencyFailure::Cancel);
        let c = on(vec![DependsOn::Earlier(0)], OnDependencyFailure::Run);
        let starts = plan(&ids, &[Some(&a), Some(&b), Some(&c)], &HashMap::new());
        assert_eq!(
            starts[0],
            Start::Cancelled {
                error: format!("dependency {gone} was deleted")
            }
        );
        assert_eq!(
            starts[1],
            Start::Cancelled {
                error: format!("dependency {} was cancelled", ids[0])
            }
        );
        assert_eq!(starts[2], Start::Queued);
    }
}
