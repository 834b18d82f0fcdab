//! Ending attempts: `POST /v1/complete`, `/v1/fail`, `/v1/release` (one
//! lease, answered with the job) and `POST /v1/finish` (many leases, each
//! answered on its own, and optionally the next claim). Every outcome goes
//! through the [`Finisher`](crate::batch::Finisher): a guarded write shared
//! with other requests' items.
//!
//! One path for all of them: a request's items become [`FinishEntry`]s
//! (verified or forged), the verified ones are written, and each entry is
//! answered from its [`Ending`] by [`FinishEntry::answer`], the one place a
//! stale lease becomes `lease_lost`.

use std::time::Instant;

use axum::Json;
use axum::extract::State;
use runlease_protocol::limits::{MAX_DELAY_MS, MAX_ERROR_LEN, MAX_LEASES_PER_REQUEST, storable_json};
use runlease_protocol::worker::{
    CompleteRequest, FailRequest, FinishAction, FinishItem, FinishRequest, FinishResponse, FinishResult,
    FinishStatus, ReleaseRequest,
};
use runlease_protocol::{Job, JobId, JobState, LeaseToken, RunLease};
use uuid::Uuid;

use crate::auth::{Action, Caller};
use crate::batch::claims::ClaimAsk;
use crate::batch::{FinishDone, FinishWork};
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, require};
use crate::http::leases::{claim_ask, count_lease_lost, fit_answer, hand_out, leases_of, park, verify};
use crate::http::{AppState, views};
use crate::metrics::Via;
use crate::store::leases::{Ending, Finished, LeaseRef, Outcome};

/// The 422 message of a value PostgreSQL cannot store.
pub(super) const NUL_REFUSED: &str =
    "a NUL character (\\u0000) cannot be stored in a result, error or progress";

/// One item of a finish, from its check to its answer.
struct FinishEntry {
    /// What the item is about: its verified lease, or what a forged token
    /// claims to be (echoed in the answer, never trusted).
    job_id: JobId,
    run_lease: RunLease,
    /// How it ends the attempt.
    action: FinishAction,
    /// The verified lease and its outcome, to write; `None` for a forged
    /// token (answered `lease_lost` without a write).
    write: Option<(LeaseRef, Outcome)>,
}

impl FinishEntry {
    /// Checks one item: its outcome (422 when it cannot be stored) and its
    /// token (400 when malformed, 403 for a key of another queue).
    fn check(
        state: &AppState,
        caller: &Caller,
        token: &LeaseToken,
        outcome: Outcome,
    ) -> Result<Self, ApiError> {
        check_storable(&outcome)?;
        let action = outcome.action();
        let entry = match verify(state, caller, token)? {
            Some(lease) => Self {
                job_id: lease.job_id,
                run_lease: lease.run_lease,
                action,
                write: Some((lease, outcome)),
            },
            None => {
                let (job_id, run_lease) = state
                    .tokens
                    .peek(token)
                    .unwrap_or((JobId(Uuid::nil()), RunLease(0)));
                Self {
                    job_id,
                    run_lease,
                    action,
                    write: None,
                }
            }
        };
        Ok(entry)
    }

    /// The entry's answer, given its ending (`None`: forged, not written).
    /// An applied outcome is counted, logged and announced; a stale lease
    /// (or a forged token) is counted as `lease_lost` and learns where its
    /// job went (a forged token learns nothing).
    fn answer(&self, state: &AppState, ending: Option<Ending>) -> Result<Finished, Option<JobState>> {
        match ending {
            Some(Ending::Applied(finished)) => {
                finished_effects(state, self.run_lease, self.action, &finished);
                Ok(finished)
            }
            Some(Ending::Lost(now)) => {
                count_lease_lost(state, self.action.as_str());
                Err(now)
            }
            None => {
                count_lease_lost(state, self.action.as_str());
                Err(None)
            }
        }
    }
}

/// Counts, logs and announces an applied finish.
pub(crate) fn finished_effects(state: &AppState, run_lease: RunLease, action: FinishAction, job: &Finished) {
    let span = tracing::Span::current();
    span.record("job_id", tracing::field::display(job.job_id));
    span.record("run_lease", run_lease.0);
    if !job.first {
        tracing::info!(job_id = %job.job_id, run_lease = run_lease.0, %action, "repeated finish answered as already applied");
        return;
    }
    state.metrics.transition_of(
        job.queue.as_str(),
        job.state,
        job.created_at,
        job.finished_at,
        Via::Worker(action),
    );
    // A completion is routine (unless the job is traced); a fail or a
    // release is worth a line.
    job_event!(job.traced || action != FinishAction::Complete, job_id = %job.job_id, run_lease = run_lease.0, state = %job.state, %action, "attempt finished");
    if let Some(dead_letter) = &job.dead_letter {
        state
            .metrics
            .dead_lettered(&state.wake, job.job_id, &job.queue, dead_letter);
    }
    if job.state.is_terminal() {
        state.wake.terminal(job.job_id);
        if state.flow.is_limited(&job.queue) {
            // The lease's slot is free: a parked claim of the queue may start a job.
            state.wake.ready(&job.queue);
        }
    } else if job.state == JobState::Queued {
        match job.requeued {
            Some(key) => state.wake.ready_at(&job.queue, key),
            None => state.wake.ready(&job.queue),
        }
    }
}

/// Writes the entries that have something to write (with `claim` riding
/// after them) and answers every entry's ending in order (`None` for a
/// forged one).
async fn write(
    state: &AppState,
    entries: &[FinishEntry],
    claim: Option<ClaimAsk>,
) -> Result<(Vec<Option<Ending>>, FinishDone), ApiError> {
    let items: Vec<(LeaseRef, Outcome)> = entries.iter().filter_map(|e| e.write.clone()).collect();
    let mut done = if items.is_empty() && claim.is_none() {
        FinishDone::default()
    } else {
        state.finisher.submit(FinishWork::new(items, claim)).await?
    };
    let mut endings = std::mem::take(&mut done.endings).into_iter();
    let per_entry = entries
        .iter()
        .map(|e| e.write.as_ref().and_then(|_| endings.next()))
        .collect();
    Ok((per_entry, done))
}

/// Applies one outcome of a one-lease call; the job as it left it.
async fn finish_one(
    state: &AppState,
    caller: &Caller,
    token: &LeaseToken,
    outcome: Outcome,
) -> Result<Json<Job>, ApiError> {
    let entry = FinishEntry::check(state, caller, token, outcome)?;
    let (mut endings, _) = write(state, std::slice::from_ref(&entry), None).await?;
    let finished = entry
        .answer(state, endings.pop().flatten())
        .map_err(|_| ApiError::lease_lost())?;
    // The one-call-per-job endpoints answer the whole job (a batched
    // `finish` answers its state).
    let job = state.store.get_job(finished.job_id).await?;
    job.map(|j| Json(views::job(j)))
        .ok_or_else(ApiError::job_not_found)
}

/// `POST /v1/complete`.
pub async fn complete(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<CompleteRequest>,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Work)?;
    finish_one(
        &state,
        &caller,
        &req.lease_token,
        Outcome::Complete { result: req.result },
    )
    .await
}

/// `POST /v1/fail`.
pub async fn fail(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<FailRequest>,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Work)?;
    let outcome = fail_outcome(req.error, req.retryable, req.retry_after_ms)?;
    finish_one(&state, &caller, &req.lease_token, outcome).await
}

/// `POST /v1/release`.
pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<ReleaseRequest>,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Work)?;
    let progress = req.progress.filter(|p| !p.is_null());
    finish_one(
        &state,
        &caller,
        &req.lease_token,
        Outcome::Release {
            progress,
            delay_ms: None,
        },
    )
    .await
}

/// A fail outcome, its delay checked and its error cut to the longest kept.
fn fail_outcome(error: String, retryable: bool, retry_after_ms: Option<i64>) -> Result<Outcome, ApiError> {
    if let Some(ms) = retry_after_ms
        && !(0..=MAX_DELAY_MS).contains(&ms)
    {
        return Err(ApiError::invalid(format!(
            "retry_after_ms must be between 0 and {MAX_DELAY_MS}"
        )));
    }
    let mut error = error;
    if error.len() > MAX_ERROR_LEN {
        let mut cut = MAX_ERROR_LEN;
        while !error.is_char_boundary(cut) {
            cut -= 1;
        }
        error.truncate(cut);
    }
    Ok(Outcome::Fail {
        error,
        retryable,
        retry_after_ms,
    })
}

/// Checks what PostgreSQL would refuse, so the request fails with 422 before
/// it joins a batch (where it would fail everyone's writes).
fn check_storable(outcome: &Outcome) -> Result<(), ApiError> {
    let ok = match outcome {
        Outcome::Complete { result } => storable_json(result),
        Outcome::Fail { error, .. } => !error.contains('\0'),
        Outcome::Release { progress, .. } => progress.as_ref().is_none_or(storable_json),
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(NUL_REFUSED))
    }
}

/// The outcome a finish item asks for.
fn item_outcome(item: &FinishItem) -> Result<Outcome, ApiError> {
    Ok(match item.action {
        FinishAction::Complete => Outcome::Complete {
            result: item.result.clone().unwrap_or_default(),
        },
        FinishAction::Fail => {
            let error = item
                .error
                .clone()
                .ok_or_else(|| ApiError::invalid("a fail needs an error"))?;
            fail_outcome(error, item.retryable.unwrap_or(true), item.retry_after_ms)?
        }
        FinishAction::Release => Outcome::Release {
            progress: item.progress.clone().filter(|p| !p.is_null()),
            delay_ms: None,
        },
    })
}

/// 422 unless a finish holds at most 1000 items, and at least one unless it
/// carries a claim.
fn require_finish_items(len: usize, claims: bool) -> Result<(), ApiError> {
    if len <= MAX_LEASES_PER_REQUEST && (len > 0 || claims) {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "items must hold 1 to {MAX_LEASES_PER_REQUEST} items (0 to {MAX_LEASES_PER_REQUEST} with a claim)"
        )))
    }
}

/// Prefixes an error's message with where it was found.
fn at(place: &str) -> impl Fn(ApiError) -> ApiError + '_ {
    move |e| ApiError {
        message: format!("{place}: {}", e.message),
        ..e
    }
}

/// `POST /v1/finish`: many outcomes, each answered on its own, in order;
/// with a `claim`, the leases it hands out once the outcomes are committed.
pub async fn finish(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(mut req): JsonBody<FinishRequest>,
) -> Result<Json<FinishResponse>, ApiError> {
    require(&caller, Action::Work)?;
    require_finish_items(req.items.len(), req.claim.is_some())?;
    // Everything is checked before anything is written: the claim, its
    // place among the parked claims, every item.
    let ask = req
        .claim
        .take()
        .map(|c| claim_ask(&caller, c))
        .transpose()
        .map_err(at("claim"))?;
    let _parking = ask.as_ref().map(|ask| park(&state, &caller, ask)).transpose()?;
    let entries = req
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let outcome = item_outcome(item).map_err(at(&format!("items[{i}]")))?;
            FinishEntry::check(&state, &caller, &item.lease_token, outcome)
                .map_err(at(&format!("items[{i}]")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // A claim rides the finisher (made after the items, in the transaction
    // that commits them) when batching is on and none of its queues has
    // flow-control limits; otherwise the claim batcher makes it.
    let started = Instant::now();
    let (ride, after) = match ask {
        Some(ask) if state.finisher.batching() && state.flow.limited(&ask.queues).is_empty() => {
            (Some(ask), None)
        }
        ask => (None, ask),
    };
    let (endings, done) = write(&state, &entries, ride.clone()).await?;
    let items = entries
        .iter()
        .zip(endings)
        .map(|(entry, ending)| {
            let (status, job_state) = match entry.answer(&state, ending) {
                Ok(finished) => (FinishStatus::Ok, Some(finished.state)),
                Err(now) => (FinishStatus::LeaseLost, now),
            };
            FinishResult {
                job_id: entry.job_id,
                run_lease: entry.run_lease,
                status,
                state: job_state,
            }
        })
        .collect();
    // Only now, with every item committed, is the claim answered: no lease
    // of it is handed out before the outcomes it follows. A claim that
    // fails after the items were written answers its error; the worker's
    // repeat is safe (the items answer as already applied).
    let leases = match (ride, after) {
        (Some(ask), _) => Some(rest_of_ride(&state, ask, done, started).await?),
        (None, Some(ask)) => Some(hand_out(&state, ask).await?),
        (None, None) => None,
    };
    Ok(Json(FinishResponse { items, leases }))
}

/// The leases of a claim that rode the finisher; with nothing claimable
/// yet, it parks for the rest of its wait.
async fn rest_of_ride(
    state: &AppState,
    ask: ClaimAsk,
    done: FinishDone,
    started: Instant,
) -> Result<Vec<runlease_protocol::worker::Lease>, ApiError> {
    let records = done.leases.unwrap_or_default();
    let waited = started.elapsed();
    if records.is_empty() && ask.wait > waited && !state.shutdown.is_cancelled() {
        let wait = ask.wait - waited;
        return hand_out(state, ClaimAsk { wait, ..ask }).await;
    }
    let records = fit_answer(state, &ask.worker, records).await;
    Ok(leases_of(state, &ask.worker, records))
}
