//! A held lease: the state the heartbeat loop and the job's task share, and
//! the claimed job as a value consumed by exactly one finishing call.

use std::sync::Mutex;
use std::time::Duration;

use runlease_protocol::worker::{FinishAction, FinishItem, FinishStatus, Lease};
use runlease_protocol::{JobId, LeaseToken, RunLease};
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::worker::finisher::FinishQueue;

/// Longest time a lease is taken to have been granted before its claim's
/// answer arrived.
const MAX_ANSWER_ALLOWANCE: Duration = Duration::from_secs(1);

/// Why the runtime stopped a handler. The first reason wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The coordinator says the lease is stale: drop the job, send nothing.
    LeaseLost,
    /// A cancel was requested: acknowledge by failing the attempt.
    CancelRequested,
    /// The job's `timeout_ms` passed: fail the attempt (retryable).
    TimedOut,
    /// No heartbeat succeeded for a whole lease TTL: the coordinator may have
    /// given the job to someone else; stop and send nothing.
    Fenced,
    /// The worker is shutting down and the drain bound passed: complete what
    /// the handler still returns within the grace, release the rest.
    Drain,
    /// The worker's hard deadline is near: as for a drain.
    Deadline,
}

/// State of one held lease, shared by its job task and the heartbeat loop.
/// Locks are never held across an await.
pub struct Held {
    pub(crate) job_id: JobId,
    pub(crate) run_lease: RunLease,
    pub(crate) token: LeaseToken,
    pub(crate) ttl: Duration,
    pub(crate) heartbeat_interval: Duration,
    pub(crate) cancel: CancellationToken,
    /// When the coordinator granted the lease (as near as the worker can tell,
    /// never later): the attempt's timeout counts from here.
    pub(crate) granted_at: Instant,
    stop: Mutex<Option<StopReason>>,
    progress: Mutex<Option<Value>>,
    /// When the last heartbeat that succeeded was *sent* (at first: when the
    /// lease was granted): the coordinator's expiry is at least a TTL after it.
    renewed_at: Mutex<Instant>,
}

impl Held {
    /// State for a lease whose claim was sent at `sent` and answered at
    /// `received`. The coordinator granted it in between: a parked claim's
    /// statement runs just before it answers, so the lease is taken to start
    /// a little before the answer (never before the claim was sent). Fencing
    /// and the attempt's timeout count from there.
    pub fn new(lease: &Lease, sent: Instant, received: Instant) -> Self {
        let ttl = Duration::from_millis(lease.lease_ttl_ms);
        let allowance = (ttl / 4).min(MAX_ANSWER_ALLOWANCE);
        let granted = sent.max(received.checked_sub(allowance).unwrap_or(sent));
        Self {
            job_id: lease.job_id,
            run_lease: lease.run_lease,
            token: lease.lease_token.clone(),
            ttl,
            heartbeat_interval: Duration::from_millis(lease.heartbeat_interval_ms),
            cancel: CancellationToken::new(),
            granted_at: granted,
            stop: Mutex::new(None),
            progress: Mutex::new(lease.progress.clone()),
            renewed_at: Mutex::new(granted),
        }
    }

    /// Stops the handler for `reason` unless it was stopped already.
    pub fn stop(&self, reason: StopReason) {
        let mut stop = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        if stop.is_none() {
            *stop = Some(reason);
            tracing::info!(job_id = %self.job_id, run_lease = self.run_lease.0, ?reason, "stopping the handler");
        }
        drop(stop);
        self.cancel.cancel();
    }

    /// Why the handler was stopped, if it was.
    pub fn stop_reason(&self) -> Option<StopReason> {
        *self.stop.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A heartbeat sent at `sent` renewed the lease.
    pub fn renewed(&self, sent: Instant) {
        let mut at = self.renewed_at.lock().unwrap_or_else(|p| p.into_inner());
        if sent > *at {
            *at = sent;
        }
    }

    /// When the handler must stop if no heartbeat succeeds before.
    pub fn fence_at(&self) -> Instant {
        *self.renewed_at.lock().unwrap_or_else(|p| p.into_inner()) + self.ttl
    }

    /// Saves a checkpoint to send.
    pub fn set_progress(&self, progress: Value) {
        *self.progress.lock().unwrap_or_else(|p| p.into_inner()) = Some(progress);
    }

    /// The latest checkpoint.
    pub fn progress(&self) -> Option<Value> {
        self.progress.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until a whole TTL has passed without a successful heartbeat, then
    /// fences the handler.
    pub async fn fence_when_unrenewed(&self) {
        loop {
            let at = self.fence_at();
            tokio::time::sleep_until(at).await;
            if Instant::now() >= self.fence_at() {
                self.stop(StopReason::Fenced);
                return;
            }
        }
    }
}

/// A claimed job: consumed by exactly one of complete, fail, release or
/// abandon, so it cannot be finished twice.
pub struct Claimed {
    finisher: FinishQueue,
    slot: Option<OwnedSemaphorePermit>,
    token: LeaseToken,
    /// The job.
    pub job_id: JobId,
    /// The lease.
    pub run_lease: RunLease,
}

impl Claimed {
    /// The claimed job behind `held`, finished through `finisher`.
    pub fn new(finisher: FinishQueue, held: &Held, slot: Option<OwnedSemaphorePermit>) -> Self {
        Self {
            finisher,
            slot,
            token: held.token.clone(),
            job_id: held.job_id,
            run_lease: held.run_lease,
        }
    }

    async fn finish(self, action: FinishAction, fill: impl FnOnce(&mut FinishItem)) -> Result<()> {
        let mut item = FinishItem {
            lease_token: self.token,
            action,
            result: None,
            error: None,
            retryable: None,
            retry_after_ms: None,
            progress: None,
        };
        fill(&mut item);
        let answer = self.finisher.submit(item, self.slot).await?;
        match answer.status {
            FinishStatus::Ok => Ok(()),
            FinishStatus::LeaseLost => Err(Error::LeaseLost(format!(
                "job {} is {} under another lease",
                self.job_id,
                answer.state.map_or("unknown".to_owned(), |s| s.to_string())
            ))),
        }
    }

    /// Completes the job (retried on transport errors: idempotent per lease).
    pub async fn complete(self, result: Value) -> Result<()> {
        self.finish(FinishAction::Complete, |i| i.result = Some(result))
            .await
    }

    /// Fails the attempt.
    pub async fn fail(self, error: String, retryable: bool, retry_after: Option<Duration>) -> Result<()> {
        let retry_after_ms = retry_after.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.finish(FinishAction::Fail, |i| {
            i.error = Some(error);
            i.retryable = Some(retryable);
            i.retry_after_ms = retry_after_ms;
        })
        .await
    }

    /// Gives the job back without charging an attempt.
    pub async fn release(self, progress: Option<Value>) -> Result<()> {
        self.finish(FinishAction::Release, |i| i.progress = progress)
            .await
    }

    /// Sends nothing: the lease is lost or fenced; the coordinator decides.
    pub fn abandon(self) {}
}

/// Whether a finishing error means the lease was already gone (not a fault).
pub fn is_lease_lost(e: &Error) -> bool {
    matches!(e, Error::LeaseLost(_))
}
