//! Claiming: the claim loop (long-polls while slots are free), the claims that
//! ride on a finish request (each slot a finished job frees is claimed again
//! in the request that carries its outcome), and starting what either hands
//! out.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use runlease_protocol::QueueName;
use runlease_protocol::worker::{ClaimRequest, Lease};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::retry::RetryPolicy;
use crate::worker::finisher::{ClaimRider, FinishQueue};
use crate::worker::job::run_job;
use crate::worker::lease::{Claimed, Held};
use crate::worker::{Inner, MIN_CLAIM_TIME_LEFT};

/// How long a claim waits for more slots to free up once one has.
const CLAIM_GATHER: Duration = Duration::from_millis(2);
/// In until-idle mode, consecutive failed claims before the worker gives up.
const UNTIL_IDLE_CLAIM_TRIES: u32 = 3;

/// What the worker runs with while it claims: shared by the claim loop and
/// the claims riding on finish requests.
#[derive(Clone)]
pub(crate) struct Claiming {
    pub inner: Arc<Inner>,
    pub finisher: FinishQueue,
    pub jobs: TaskTracker,
    pub slots: Arc<Semaphore>,
    pub stop: CancellationToken,
}

impl Claiming {
    /// A claim for `max_jobs` slots, with the long-poll `wait` shortened and
    /// the time left given in deadline mode; `None` once the deadline is too
    /// near to claim.
    fn request(&self, max_jobs: usize, wait: Duration) -> Option<ClaimRequest> {
        let inner = &self.inner;
        let mut wait = wait;
        let mut time_left_ms = None;
        if let Some(deadline) = inner.deadline {
            // Claiming stops once the release point is near; the coordinator is
            // told the whole remaining run time, so a job whose timeout fits
            // may still be running at the release point: it is then released
            // (no attempt charged) rather than left to time out.
            let now = Instant::now();
            let release_at = deadline.checked_sub(inner.release_margin).unwrap_or(now);
            let before_release = release_at.saturating_duration_since(now);
            if before_release < MIN_CLAIM_TIME_LEFT {
                return None;
            }
            wait = wait.min(before_release.saturating_sub(MIN_CLAIM_TIME_LEFT));
            let left = deadline.saturating_duration_since(now);
            time_left_ms = Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
        }
        let queues: Vec<QueueName> = inner.handlers.keys().cloned().collect();
        Some(ClaimRequest {
            queues,
            worker_id: inner.worker_id.clone(),
            max_jobs: u32::try_from(max_jobs).unwrap_or(u32::MAX),
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(0),
            time_left_ms,
        })
    }

    /// Starts a job task for each lease, each with one of `permits`; a lease
    /// with no handler, no slot, or arriving while the worker stops is
    /// released unrun. Leftover permits go back to the pool.
    async fn start(
        &self,
        leases: Vec<Lease>,
        mut permits: Vec<OwnedSemaphorePermit>,
        sent: Instant,
        received: Instant,
    ) {
        let inner = &self.inner;
        let stopping = self.stop.is_cancelled();
        for lease in leases {
            let held = Arc::new(Held::new(&lease, sent, received));
            if stopping {
                release_unstarted(inner, &self.finisher, &held, "the worker is stopping").await;
                continue;
            }
            let Some(handler) = inner.handlers.get(&lease.queue).cloned() else {
                release_unstarted(inner, &self.finisher, &held, "no handler for this queue").await;
                continue;
            };
            let Some(permit) = permits.pop() else {
                release_unstarted(inner, &self.finisher, &held, "more leases than free slots").await;
                continue;
            };
            inner
                .held
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(lease.job_id, held.clone());
            inner.added.notify_one();
            let inner = inner.clone();
            let finisher = self.finisher.clone();
            // trace_id and traceparent: the producer's trace, which this span joins.
            let span = tracing::info_span!(
                "job", job_id = %lease.job_id, run_lease = lease.run_lease.0, queue = %lease.queue,
                trace_id = lease.traceparent.as_ref().map(|t| t.trace_id()),
                traceparent = lease.traceparent.as_ref().map(|t| t.as_str()),
            );
            self.jobs
                .spawn(run_job(inner, finisher, handler, lease, held, permit).instrument(span));
        }
    }
}

impl ClaimRider for Claiming {
    fn claim(&self, slots: usize) -> Option<ClaimRequest> {
        if self.stop.is_cancelled() {
            return None;
        }
        // No long-poll: the finish items are answered with the claim.
        self.request(slots, Duration::ZERO)
    }

    fn start(&self, leases: Vec<Lease>, slots: Vec<OwnedSemaphorePermit>, sent: Instant, received: Instant) {
        self.inner
            .counters
            .claims_answered
            .fetch_add(1, Ordering::Relaxed);
        if leases.is_empty() {
            return;
        }
        let claiming = self.clone();
        // Off the finishing queue's task: a lease released unrun goes
        // through that queue.
        self.jobs
            .spawn(async move { claiming.start(leases, slots, sent, received).await });
    }
}

/// Claims while there are free slots, until `stop` fires.
pub(crate) async fn claim_loop(claiming: &Claiming) {
    let inner = &claiming.inner;
    let slots = &claiming.slots;
    let stop = &claiming.stop;
    let mut failures = 0u32;
    loop {
        let first = tokio::select! {
            permit = slots.clone().acquire_owned() => match permit { Ok(p) => p, Err(_) => return },
            () = stop.cancelled() => return,
        };
        let mut permits = vec![first];
        // Jobs finished together (one /v1/finish answer) free their slots one
        // task after another, and short jobs finished a moment apart free
        // theirs one finish answer later: gather what frees up within
        // CLAIM_GATHER, so one claim asks for all of it. A worker of long
        // jobs claims at most that much later.
        let gather_until = Instant::now() + CLAIM_GATHER;
        while permits.len() < inner.concurrency {
            while let Ok(p) = slots.clone().try_acquire_owned() {
                permits.push(p);
            }
            if permits.len() >= inner.concurrency {
                break;
            }
            match tokio::time::timeout_at(gather_until, slots.clone().acquire_owned()).await {
                Ok(Ok(p)) => permits.push(p),
                _ => break,
            }
        }

        let Some(req) = claiming.request(permits.len(), inner.claim_wait) else {
            tracing::info!("deadline near: no more claims");
            return;
        };
        let sent = Instant::now();
        let claim = inner.client.claim(&req);
        tokio::pin!(claim);
        let answer = tokio::select! {
            answer = &mut claim => answer,
            () = stop.cancelled() => {
                // Let the claim in flight answer (bounded): leases it brings
                // back are released at once rather than left to expire.
                match tokio::time::timeout(inner.drain_timeout, &mut claim).await {
                    Ok(answer) => answer,
                    Err(_) => return,
                }
            }
        };
        match answer {
            Ok(answer) => {
                failures = 0;
                inner.counters.claims_answered.fetch_add(1, Ordering::Relaxed);
                if answer.leases.is_empty() && inner.until_idle {
                    tracing::info!("nothing left to claim: stopping (until idle)");
                    return;
                }
                claiming.start(answer.leases, permits, sent, Instant::now()).await;
                if stop.is_cancelled() {
                    return;
                }
            }
            Err(e) => {
                failures += 1;
                inner.counters.claims_failed.fetch_add(1, Ordering::Relaxed);
                if inner.until_idle && failures >= UNTIL_IDLE_CLAIM_TRIES {
                    tracing::warn!(error = %e, "claims keep failing: stopping (until idle)");
                    return;
                }
                let delay = RetryPolicy::default().delay(failures.min(6), e.retry_after());
                tracing::warn!(error = %e, ?delay, "claim failed; backing off");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = stop.cancelled() => return,
                }
            }
        }
    }
}

async fn release_unstarted(inner: &Inner, finisher: &FinishQueue, held: &Held, why: &str) {
    tracing::info!(job_id = %held.job_id, why, "releasing a lease without running it");
    match Claimed::new(finisher.clone(), held, None)
        .release(held.progress())
        .await
    {
        Ok(()) => inner.counters.released.fetch_add(1, Ordering::Relaxed),
        Err(_) => inner.counters.abandoned.fetch_add(1, Ordering::Relaxed),
    };
}
