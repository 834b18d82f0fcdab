//! Heartbeats: leases renewed (and checkpoints saved) in one statement,
//! guarded on `(id, state = 'running', run_lease)` like every write after
//! the claim.

use std::collections::HashMap;

use runlease_protocol::worker::HeartbeatStatus;
use runlease_protocol::{JobId, RunLease};
use serde_json::Value;
use uuid::Uuid;

use crate::store::rows::col;
use crate::store::{Store, StoreError, ms, sql};

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

impl Store {
    /// Renews leases in one statement; answers each renewal in order.
    pub async fn heartbeat(&self, renewals: &[&Renewal]) -> Result<Vec<HeartbeatStatus>, StoreError> {
        self.timed("heartbeat", || async move {
            let client = self.conn().await?;
            let ids: Vec<Uuid> = renewals.iter().map(|r| r.job_id.0).collect();
            let leases: Vec<i64> = renewals.iter().map(|r| r.run_lease.0).collect();
            let progress: Vec<Option<&Value>> = renewals.iter().map(|r| r.progress.as_ref()).collect();
            let terms = self.lease_settings();
            let stmt = client.prepare_cached(sql::LEASE_HEARTBEAT).await?;
            let rows = client
                .query(
                    &stmt,
                    &[
                        &ids,
                        &leases,
                        &progress,
                        &ms(terms.ttl),
                        &ms(terms.default_timeout),
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
        })
        .await
    }
}
