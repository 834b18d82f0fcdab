//! Worker operations. Every write here after the claim is one statement guarded
//! on `(id, state = 'running', run_lease)`; a guard that matches no row means
//! the caller's lease is stale.

use std::collections::HashMap;

use runlease_protocol::worker::HeartbeatStatus;
use runlease_protocol::{AttemptOutcome, JobId, QueueName, RunLease, WorkerId};
use serde_json::Value;
use uuid::Uuid;

use crate::store::rows::{DbOutcome, JobRecord, col};
use crate::store::{Guarded, Store, StoreError, sql};

/// One way an attempt ends by its worker's hand; each maps to one guarded statement.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// `lease_complete.sql`.
    Complete {
        /// The job's result.
        result: Value,
    },
    /// `lease_fail.sql`.
    Fail {
        /// What went wrong.
        error: String,
        /// Whether another attempt may help.
        retryable: bool,
        /// The worker's retry delay; backoff when `None`.
        retry_after_ms: Option<i64>,
    },
    /// `lease_release.sql`.
    Release {
        /// Checkpoint for the next attempt; `None` keeps the saved one.
        progress: Option<Value>,
    },
}

impl Outcome {
    /// Whether an attempt that ended with `recorded` is this outcome already
    /// applied (so a repeat answers 200 instead of 409).
    fn matches(&self, recorded: AttemptOutcome) -> bool {
        match self {
            Outcome::Complete { .. } => recorded == AttemptOutcome::Completed,
            Outcome::Fail { .. } => {
                matches!(recorded, AttemptOutcome::Failed | AttemptOutcome::Cancelled)
            }
            Outcome::Release { .. } => {
                matches!(recorded, AttemptOutcome::Released | AttemptOutcome::Cancelled)
            }
        }
    }

    /// The name of the outcome, for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Complete { .. } => "complete",
            Outcome::Fail { .. } => "fail",
            Outcome::Release { .. } => "release",
        }
    }
}

/// One lease to renew.
#[derive(Debug, Clone)]
pub struct Renewal {
    /// The job.
    pub job_id: JobId,
    /// The lease.
    pub run_lease: RunLease,
    /// Checkpoint to save.
    pub progress: Option<Value>,
}

/// A lease's identity as read from a verified token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    /// The job.
    pub job_id: JobId,
    /// The lease.
    pub run_lease: RunLease,
    /// The worker the lease was handed to.
    pub worker_id: WorkerId,
}

/// How a finish ended when it applied.
#[derive(Debug)]
pub struct Finished {
    /// The job as the write (or, for a repeat, the database now) holds it.
    pub record: JobRecord,
    /// False when this was a repeat of an outcome already applied.
    pub first: bool,
}

impl Store {
    /// Claims up to `limit` due jobs of `queues` for `worker`.
    pub async fn claim(
        &self,
        queues: &[QueueName],
        worker: &WorkerId,
        limit: u32,
        time_left_ms: Option<u64>,
    ) -> Result<Vec<JobRecord>, StoreError> {
        let client = self.conn().await?;
        let queues: Vec<&str> = queues.iter().map(QueueName::as_str).collect();
        let limit = i64::from(limit);
        let time_left = time_left_ms.map(|t| i64::try_from(t).unwrap_or(i64::MAX));
        let policy = self.policy();
        let stmt = client.prepare_cached(sql::LEASE_CLAIM).await?;
        let rows = client
            .query(
                &stmt,
                &[
                    &queues,
                    &worker.as_str(),
                    &limit,
                    &policy.lease_ttl_ms,
                    &policy.default_timeout_ms,
                    &time_left,
                ],
            )
            .await?;
        let mut records = JobRecord::from_rows(&rows)?;
        records.sort_by(|a, b| {
            (a.job.priority, a.job.run_at, a.job.id).cmp(&(b.job.priority, b.job.run_at, b.job.id))
        });
        Ok(records)
    }

    /// Renews leases in one statement; answers each renewal in order.
    pub async fn heartbeat(&self, renewals: &[Renewal]) -> Result<Vec<HeartbeatStatus>, StoreError> {
        let client = self.conn().await?;
        let ids: Vec<Uuid> = renewals.iter().map(|r| r.job_id.0).collect();
        let leases: Vec<i64> = renewals.iter().map(|r| r.run_lease.0).collect();
        let progress: Vec<Option<&Value>> = renewals.iter().map(|r| r.progress.as_ref()).collect();
        let policy = self.policy();
        let stmt = client.prepare_cached(sql::LEASE_HEARTBEAT).await?;
        let rows = client
            .query(
                &stmt,
                &[
                    &ids,
                    &leases,
                    &progress,
                    &policy.lease_ttl_ms,
                    &policy.default_timeout_ms,
                ],
            )
            .await?;
        let mut matched: HashMap<(Uuid, i64), HeartbeatStatus> = HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: Uuid = col(row, "id")?;
            let lease: i64 = col(row, "run_lease")?;
            let cancel: bool = col(row, "cancel_requested")?;
            let live: bool = col(row, "live")?;
            let status = match (live, cancel) {
                // Past its timeout the lease is no longer renewed: the reaper takes it.
                (false, _) => HeartbeatStatus::LeaseLost,
                (true, true) => HeartbeatStatus::CancelRequested,
                (true, false) => HeartbeatStatus::Renewed,
            };
            matched.insert((id, lease), status);
        }
        Ok(renewals
            .iter()
            .map(|r| {
                matched
                    .get(&(r.job_id.0, r.run_lease.0))
                    .copied()
                    .unwrap_or(HeartbeatStatus::LeaseLost)
            })
            .collect())
    }

    /// Ends an attempt with one guarded statement. A repeat of an outcome that
    /// already took effect under the same lease (same worker) is `Applied` with
    /// `first: false`; any other mismatch is `Stale`.
    pub async fn finish(&self, lease: &LeaseRef, outcome: &Outcome) -> Result<Guarded<Finished>, StoreError> {
        let client = self.conn().await?;
        let id = lease.job_id.0;
        let run_lease = lease.run_lease.0;
        let policy = self.policy();
        let rows = match outcome {
            Outcome::Complete { result } => {
                let stmt = client.prepare_cached(sql::LEASE_COMPLETE).await?;
                client.query(&stmt, &[&id, &run_lease, result]).await?
            }
            Outcome::Fail {
                error,
                retryable,
                retry_after_ms,
            } => {
                let stmt = client.prepare_cached(sql::LEASE_FAIL).await?;
                client
                    .query(
                        &stmt,
                        &[
                            &id,
                            &run_lease,
                            error,
                            retryable,
                            retry_after_ms,
                            &policy.backoff_base_ms,
                            &policy.backoff_cap_ms,
                        ],
                    )
                    .await?
            }
            Outcome::Release { progress } => {
                let stmt = client.prepare_cached(sql::LEASE_RELEASE).await?;
                client.query(&stmt, &[&id, &run_lease, progress]).await?
            }
        };
        if let Some(row) = rows.first() {
            return Ok(Guarded::Applied(Finished {
                record: JobRecord::from_row(row)?,
                first: true,
            }));
        }

        // No row matched: a repeat of this very outcome, or a stale lease.
        let stmt = client.prepare_cached(sql::ATTEMPT_GET).await?;
        let Some(row) = client.query_opt(&stmt, &[&id, &run_lease]).await? else {
            return Ok(Guarded::Stale);
        };
        let recorded: DbOutcome = col(&row, "outcome")?;
        let worker: String = col(&row, "worker_id")?;
        if worker != lease.worker_id.as_str() || !outcome.matches(recorded.0) {
            return Ok(Guarded::Stale);
        }
        let stmt = client.prepare_cached(sql::JOB_GET).await?;
        let rows = client.query(&stmt, &[&vec![id]]).await?;
        match rows.first() {
            Some(row) => Ok(Guarded::Applied(Finished {
                record: JobRecord::from_row(row)?,
                first: false,
            })),
            None => Ok(Guarded::Stale),
        }
    }

    /// Reaps up to `limit` expired leases; returns the jobs as the reaper left them.
    pub async fn reap(&self, limit: i64) -> Result<Vec<JobRecord>, StoreError> {
        let client = self.conn().await?;
        let stmt = client.prepare_cached(sql::LEASE_REAP).await?;
        let rows = client
            .query(&stmt, &[&limit, &self.policy().default_timeout_ms])
            .await?;
        JobRecord::from_rows(&rows)
    }
}
