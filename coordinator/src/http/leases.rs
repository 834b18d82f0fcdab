//! Worker endpoints: claim (long-poll), heartbeat, complete, fail, release,
//! finish. Tokens are verified before any database work; a stale lease
//! becomes 409 `lease_lost` (counted by action) in [`lease_lost`].

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use runlease_protocol::limits::{
    MAX_CLAIM_JOBS, MAX_CLAIM_QUEUES, MAX_DELAY_MS, MAX_ERROR_LEN, MAX_LEASES_PER_REQUEST, MAX_WAIT_MS,
    storable_json,
};
use runlease_protocol::worker::{
    ClaimRequest, ClaimResponse, CompleteRequest, FailRequest, FinishAction, FinishItem, FinishRequest,
    FinishResponse, FinishResult, FinishStatus, HeartbeatRequest, HeartbeatResponse, HeartbeatResult,
    HeartbeatStatus, Lease, ReleaseRequest,
};
use runlease_protocol::{ErrorCode, Job, JobId, JobState, LeaseToken, QueueName, RunLease, WorkerId};
use uuid::Uuid;

use crate::auth::{Action, Caller};
use crate::batch::claims::ClaimAsk;
use crate::batch::{FinishDone, FinishWork};
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, require};
use crate::http::{AppState, views};
use crate::metrics::{ActionLabels, QueueLabels, Via};
use crate::store::leases::{Ending, Finished, LeaseRef, Outcome, OutcomeKind, Renewal};
use crate::store::rows::{ClaimedJob, FIXED_FIELD_BYTES, json_len};
use crate::token::TokenError;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `POST /v1/claim`: up to `max_jobs` leases; parks up to `wait_ms` when none
/// is claimable, woken by a local enqueue and re-checking on a timer.
pub async fn claim(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<ClaimRequest>,
) -> Result<Json<ClaimResponse>, ApiError> {
    require(&caller, Action::Work)?;
    let ask = claim_ask(&caller, req)?;
    // Held until the answer: a claim that may park takes a place first.
    let _parking = park(&state, &caller, &ask)?;
    let leases = hand_out(&state, ask).await?;
    Ok(Json(ClaimResponse { leases }))
}

/// A place among the parked claims for a claim that may wait, or 429.
fn park(
    state: &AppState,
    caller: &Caller,
    ask: &ClaimAsk,
) -> Result<Option<crate::limits::Parking>, ApiError> {
    if ask.wait.is_zero() {
        Ok(None)
    } else {
        state.park_claim(caller).map(Some)
    }
}

/// Checks a claim (of `/v1/claim`, or riding on `/v1/finish`).
fn claim_ask(caller: &Caller, req: ClaimRequest) -> Result<ClaimAsk, ApiError> {
    if req.queues.is_empty() || req.queues.len() > MAX_CLAIM_QUEUES {
        return Err(ApiError::invalid(format!(
            "queues must name 1 to {MAX_CLAIM_QUEUES} queues"
        )));
    }
    if !(1..=MAX_CLAIM_JOBS).contains(&req.max_jobs) {
        return Err(ApiError::invalid(format!(
            "max_jobs must be between 1 and {MAX_CLAIM_JOBS}"
        )));
    }
    if req.wait_ms > MAX_WAIT_MS {
        return Err(ApiError::invalid(format!(
            "wait_ms must be between 0 and {MAX_WAIT_MS}"
        )));
    }
    if let Some(q) = req.queues.iter().find(|q| !caller.may_use_queue(q)) {
        return Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("this API key may not claim from queue {q:?}"),
        ));
    }
    let queues: Vec<QueueName> = req
        .queues
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok(ClaimAsk {
        queues,
        worker: req.worker_id,
        max_jobs: req.max_jobs,
        time_left_ms: req.time_left_ms,
        wait: Duration::from_millis(req.wait_ms),
    })
}

/// Claims what `ask` asks for and mints a lease of each job.
async fn hand_out(state: &AppState, ask: ClaimAsk) -> Result<Vec<Lease>, ApiError> {
    let worker = ask.worker.clone();
    let records = state.claims.claim(ask).await?;
    let records = fit_answer(state, &worker, records).await;
    Ok(leases_of(state, &worker, records))
}

/// The claimed jobs that fit in one answer (`RUNLEASE_MAX_ANSWER_BYTES`,
/// and always the first); the rest are given back at once, no attempt
/// charged, for the next claim to take.
async fn fit_answer(state: &AppState, worker: &WorkerId, mut records: Vec<ClaimedJob>) -> Vec<ClaimedJob> {
    let mut bytes = 0;
    let mut fit = 0;
    for job in &records {
        let size = FIXED_FIELD_BYTES + json_len(&job.payload) + job.progress.as_ref().map_or(0, json_len);
        if fit > 0 && bytes + size > state.max_answer_bytes {
            break;
        }
        bytes += size;
        fit += 1;
    }
    if fit < records.len() {
        let rest = records.split_off(fit);
        tracing::info!(
            handed_out = fit,
            given_back = rest.len(),
            "a claim's jobs exceed RUNLEASE_MAX_ANSWER_BYTES: giving the rest back"
        );
        state
            .metrics
            .requests_refused
            .get_or_create(&crate::metrics::RefusedLabels {
                limit: "answer_bytes",
            })
            .inc();
        crate::batch::claims::release_unwanted(&state.store, &state.wake, worker, rest).await;
    }
    records
}

/// Mints a lease of each job claimed for `worker`.
fn leases_of(state: &AppState, worker: &WorkerId, records: Vec<ClaimedJob>) -> Vec<Lease> {
    let terms = state.store.lease_settings();
    records
        .into_iter()
        .map(|r| {
            let job = r;
            state.metrics.claimed.get_or_create(&QueueLabels { queue: job.queue.to_string() }).inc();
            job_event!(job.traceparent.is_some(), job_id = %job.id, run_lease = job.run_lease.0, worker_id = %worker, attempt = job.attempt, trace_id = job.traceparent.as_ref().map(|t| t.trace_id()), "job claimed");
            let timeout = job.timeout_ms.map_or(terms.default_timeout, |t| Duration::from_millis(t as u64));
            Lease {
                lease_token: state.tokens.mint(job.id, job.run_lease, worker, &job.queue),
                job_id: job.id,
                run_lease: job.run_lease,
                queue: job.queue,
                payload: job.payload,
                attempt: job.attempt,
                progress: job.progress,
                lease_ttl_ms: millis(terms.ttl),
                heartbeat_interval_ms: millis(terms.heartbeat_interval),
                timeout_ms: millis(timeout),
                traceparent: job.traceparent,
            }
        })
        .collect()
}

/// Verifies a token. Malformed: 400 for the whole request. Forged: `None`,
/// counted, and answered `lease_lost` by the caller. A token of a job whose
/// queue the caller's key may not use: 403 for the whole request.
fn verify(state: &AppState, caller: &Caller, token: &LeaseToken) -> Result<Option<LeaseRef>, ApiError> {
    match state.tokens.verify_scoped(token) {
        Ok(claims) => {
            check_scope(caller, claims.queue.as_ref())?;
            Ok(Some(claims.lease))
        }
        Err(TokenError::Malformed) => {
            state.metrics.forged_tokens.inc();
            Err(ApiError::bad_request(TokenError::Malformed.to_string()))
        }
        Err(TokenError::Forged) => {
            state.metrics.forged_tokens.inc();
            tracing::warn!("refused a lease token that does not verify");
            Ok(None)
        }
    }
}

/// 403 unless the caller's key may use the queue a token names. A key
/// without queue limits may use any token; a limited key only tokens that
/// name one of its queues (so not tokens minted before tokens named it).
fn check_scope(caller: &Caller, queue: Option<&QueueName>) -> Result<(), ApiError> {
    if caller.queues.is_none() {
        return Ok(());
    }
    match queue {
        Some(queue) if caller.may_use_queue(queue) => Ok(()),
        Some(queue) => Err(ApiError::new(
            ErrorCode::Forbidden,
            format!("this lease is of a job of queue {queue:?}, which this API key may not use"),
        )),
        None => Err(ApiError::new(
            ErrorCode::Forbidden,
            "this lease token was minted by a coordinator older than v1.2 and does not name its queue; only a key without queue limits may use it",
        )),
    }
}

fn lease_lost(state: &AppState, action: &str) -> ApiError {
    state
        .metrics
        .lease_lost
        .get_or_create(&ActionLabels {
            action: action.to_owned(),
        })
        .inc();
    ApiError::lease_lost()
}

/// 422 unless a list holds 1 to 1000 items.
fn require_items(field: &str, len: usize) -> Result<(), ApiError> {
    if (1..=MAX_LEASES_PER_REQUEST).contains(&len) {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "{field} must hold 1 to {MAX_LEASES_PER_REQUEST} items"
        )))
    }
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

/// `POST /v1/heartbeat`: renews many leases in one statement.
pub async fn heartbeat(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<HeartbeatRequest>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    require(&caller, Action::Work)?;
    require_items("leases", req.leases.len())?;
    if req
        .leases
        .iter()
        .any(|l| l.progress.as_ref().is_some_and(|p| !storable_json(p)))
    {
        return Err(ApiError::invalid(NUL_REFUSED));
    }
    let mut verified = Vec::with_capacity(req.leases.len());
    for item in &req.leases {
        verified.push(verify(&state, &caller, &item.lease_token)?.ok_or(&item.lease_token));
    }
    let renewals: Vec<Renewal> = req
        .leases
        .iter()
        .zip(&verified)
        .filter_map(|(item, v)| {
            v.as_ref().ok().map(|lease| Renewal {
                job_id: lease.job_id,
                run_lease: lease.run_lease,
                progress: item.progress.clone().filter(|p| !p.is_null()),
            })
        })
        .collect();
    let mut statuses = if renewals.is_empty() {
        Vec::new()
    } else {
        state.renewer.submit(renewals).await?
    }
    .into_iter();
    let mut answers = Vec::with_capacity(verified.len());
    for v in verified {
        let (job_id, run_lease, status) = match v {
            Ok(lease) => (
                lease.job_id,
                lease.run_lease,
                statuses.next().unwrap_or(HeartbeatStatus::LeaseLost),
            ),
            Err(token) => {
                // Echo what the forged token claims to be, so the worker can
                // match the answer; nothing of it was trusted.
                let (job_id, run_lease) = state
                    .tokens
                    .peek(token)
                    .unwrap_or((JobId(Uuid::nil()), RunLease(0)));
                (job_id, run_lease, HeartbeatStatus::LeaseLost)
            }
        };
        if status == HeartbeatStatus::LeaseLost {
            state
                .metrics
                .lease_lost
                .get_or_create(&ActionLabels {
                    action: "heartbeat".into(),
                })
                .inc();
        }
        answers.push(HeartbeatResult {
            job_id,
            run_lease,
            status,
        });
    }
    Ok(Json(HeartbeatResponse { leases: answers }))
}

/// Counts, logs and announces an applied finish.
fn finished_effects(state: &AppState, run_lease: RunLease, kind: OutcomeKind, job: &Finished) {
    let action = kind.name();
    if !job.first {
        tracing::info!(job_id = %job.job_id, run_lease = run_lease.0, action, "repeated finish answered as already applied");
        return;
    }
    let via = match kind {
        OutcomeKind::Complete => Via::Complete,
        OutcomeKind::Fail => Via::Fail,
        OutcomeKind::Release => Via::Release,
    };
    state.metrics.transition_of(
        job.queue.as_str(),
        job.state,
        job.created_at,
        job.finished_at,
        via,
    );
    // A completion is routine (unless the job is traced); a fail or a
    // release is worth a line.
    job_event!(job.traced || kind != OutcomeKind::Complete, job_id = %job.job_id, run_lease = run_lease.0, state = %job.state, action, "attempt finished");
    if job.state.is_terminal() {
        state.wake.terminal(job.job_id);
        if state.flow.is_limited(&job.queue) {
            // The lease's slot is free: a parked claim of the queue may start a job.
            state.wake.ready(&job.queue);
        }
    } else if job.state == JobState::Queued {
        state.wake.ready(&job.queue);
    }
}

/// Applies one finishing outcome: verify, guarded write (batched with other
/// requests), metrics, wake-ups.
async fn finish_one(
    state: &AppState,
    caller: &Caller,
    token: &LeaseToken,
    outcome: Outcome,
) -> Result<Finished, ApiError> {
    let kind = outcome.kind();
    check_storable(&outcome)?;
    let Some(lease) = verify(state, caller, token)? else {
        return Err(lease_lost(state, kind.name()));
    };
    let span = tracing::Span::current();
    span.record("job_id", tracing::field::display(lease.job_id));
    span.record("run_lease", lease.run_lease.0);
    let run_lease = lease.run_lease;
    let mut answers = state
        .finisher
        .submit(FinishWork::new(vec![(lease, outcome)], None))
        .await?
        .endings;
    let ending = answers
        .pop()
        .ok_or_else(|| ApiError::new(ErrorCode::Internal, "a finish answered nothing"))?;
    let finished = match ending {
        Ending::Applied(finished) => finished,
        Ending::Lost(_) => return Err(lease_lost(state, kind.name())),
    };
    finished_effects(state, run_lease, kind, &finished);
    Ok(finished)
}

/// The job a single finish left, with its chronology: the one-call-per-job
/// endpoints answer the whole job (a batched `finish` answers its state).
async fn answer(state: &AppState, finished: Finished) -> Result<Json<Job>, ApiError> {
    let job = state.store.get_job(finished.job_id).await?;
    job.map(|j| Json(views::job(j)))
        .ok_or_else(ApiError::job_not_found)
}

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

/// `POST /v1/complete`.
pub async fn complete(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<CompleteRequest>,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Work)?;
    let finished = finish_one(
        &state,
        &caller,
        &req.lease_token,
        Outcome::Complete { result: req.result },
    )
    .await?;
    answer(&state, finished).await
}

/// `POST /v1/fail`.
pub async fn fail(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<FailRequest>,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Work)?;
    let outcome = fail_outcome(req.error, req.retryable, req.retry_after_ms)?;
    let finished = finish_one(&state, &caller, &req.lease_token, outcome).await?;
    answer(&state, finished).await
}

/// `POST /v1/release`.
pub async fn release(
    State(state): State<AppState>,
    caller: Caller,
    JsonBody(req): JsonBody<ReleaseRequest>,
) -> Result<Json<Job>, ApiError> {
    require(&caller, Action::Work)?;
    let progress = req.progress.filter(|p| !p.is_null());
    let finished = finish_one(&state, &caller, &req.lease_token, Outcome::Release { progress }).await?;
    answer(&state, finished).await
}

const NUL_REFUSED: &str = "a NUL character (\\u0000) cannot be stored in a result, error or progress";

/// Checks what PostgreSQL would refuse, so the request fails with 422 before
/// it joins a batch (where it would fail everyone's writes).
fn check_storable(outcome: &Outcome) -> Result<(), ApiError> {
    let ok = match outcome {
        Outcome::Complete { result } => storable_json(result),
        Outcome::Fail { error, .. } => !error.contains('\0'),
        Outcome::Release { progress } => progress.as_ref().is_none_or(storable_json),
    };
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(NUL_REFUSED))
    }
}

fn item_outcome(item: &FinishItem, index: usize) -> Result<Outcome, ApiError> {
    let at = |e: ApiError| ApiError {
        message: format!("items[{index}]: {}", e.message),
        ..e
    };
    let outcome = match item.action {
        FinishAction::Complete => Outcome::Complete {
            result: item.result.clone().unwrap_or_default(),
        },
        FinishAction::Fail => {
            let error = item
                .error
                .clone()
                .ok_or_else(|| at(ApiError::invalid("a fail needs an error")))?;
            fail_outcome(error, item.retryable.unwrap_or(true), item.retry_after_ms).map_err(at)?
        }
        FinishAction::Release => Outcome::Release {
            progress: item.progress.clone().filter(|p| !p.is_null()),
        },
    };
    check_storable(&outcome).map_err(at)?;
    Ok(outcome)
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
    // The claim is checked before anything is written, made after.
    let ask = req
        .claim
        .take()
        .map(|claim| claim_ask(&caller, claim))
        .transpose()
        .map_err(|e| ApiError {
            message: format!("claim: {}", e.message),
            ..e
        })?;
    // Before anything is written: a finish refused for its claim's place
    // changes nothing.
    let _parking = ask.as_ref().map(|ask| park(&state, &caller, ask)).transpose()?;
    // Validate everything first: a bad item fails the request before any
    // write. Each token is verified once; a forged one is answered
    // lease_lost without a write.
    let mut checked = Vec::with_capacity(req.items.len());
    for (i, item) in req.items.iter().enumerate() {
        let lease = verify(&state, &caller, &item.lease_token).map_err(|e| ApiError {
            message: format!("items[{i}]: {}", e.message),
            ..e
        })?;
        checked.push((lease, item_outcome(item, i)?));
    }
    // The rest are written together, in one transaction (with other
    // requests' items when batching is on).
    let mut verified = Vec::with_capacity(checked.len());
    // (item index, lease, kind) of each verified item, in order.
    let mut sent = Vec::with_capacity(checked.len());
    for (i, (lease, outcome)) in checked.into_iter().enumerate() {
        match lease {
            Some(lease) => {
                sent.push((i, lease.job_id, lease.run_lease, outcome.kind()));
                verified.push((lease, outcome));
            }
            None => {
                state
                    .metrics
                    .lease_lost
                    .get_or_create(&ActionLabels {
                        action: outcome.name().to_owned(),
                    })
                    .inc();
            }
        }
    }
    // A claim rides the finisher (made in the first batch after the one
    // that commits the items, sharing its transaction) when batching is on
    // and none of its queues has flow-control limits; otherwise, and for
    // whatever long-poll is left, the claim batcher makes it.
    let started = Instant::now();
    let (ride, after) = match ask {
        Some(ask) if state.finisher.batching() && state.flow.limited(&ask.queues).is_empty() => {
            (Some(ask), None)
        }
        ask => (None, ask),
    };
    let done = if verified.is_empty() && ride.is_none() {
        FinishDone::default()
    } else {
        state
            .finisher
            .submit(FinishWork::new(verified, ride.clone()))
            .await?
    };
    let answers = done.endings;
    // A stale lease learns where its job went; a forged token learns nothing.
    let mut statuses: Vec<Option<JobState>> = vec![None; req.items.len()];
    let mut ok = vec![false; req.items.len()];
    for (&(i, _, run_lease, kind), ending) in sent.iter().zip(answers) {
        match ending {
            Ending::Applied(finished) => {
                finished_effects(&state, run_lease, kind, &finished);
                statuses[i] = Some(finished.state);
                ok[i] = true;
            }
            Ending::Lost(now) => {
                state
                    .metrics
                    .lease_lost
                    .get_or_create(&ActionLabels {
                        action: kind.name().to_owned(),
                    })
                    .inc();
                statuses[i] = now;
            }
        }
    }
    // Verified items answer with their lease; a forged token with what it
    // claims to be (nothing of it was trusted).
    let mut ids: Vec<Option<(JobId, RunLease)>> = vec![None; req.items.len()];
    for &(i, job_id, run_lease, _) in &sent {
        ids[i] = Some((job_id, run_lease));
    }
    let results = req
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let (job_id, run_lease) = ids[i]
                .or_else(|| state.tokens.peek(&item.lease_token))
                .unwrap_or((JobId(Uuid::nil()), RunLease(0)));
            FinishResult {
                job_id,
                run_lease,
                status: if ok[i] {
                    FinishStatus::Ok
                } else {
                    FinishStatus::LeaseLost
                },
                state: statuses[i],
            }
        })
        .collect();
    // Only now, with every item committed (submit answered), is the claim
    // made: no lease of it can be handed out before the outcomes it follows.
    // A claim that fails after the items were written answers its error; the
    // worker's repeat is safe (the items answer as already applied).
    let leases = match (ride, after) {
        (Some(ask), _) => {
            let records = done.leases.unwrap_or_default();
            let waited = started.elapsed();
            if records.is_empty() && ask.wait > waited && !state.shutdown.is_cancelled() {
                // Nothing claimable yet: park for the rest of the wait.
                let wait = ask.wait - waited;
                Some(hand_out(&state, ClaimAsk { wait, ..ask }).await?)
            } else {
                let records = fit_answer(&state, &ask.worker, records).await;
                Some(leases_of(&state, &ask.worker, records))
            }
        }
        (None, Some(ask)) => Some(hand_out(&state, ask).await?),
        (None, None) => None,
    };
    Ok(Json(FinishResponse {
        items: results,
        leases,
    }))
}
