//! Worker endpoints: claim (long-poll) and heartbeat, and what the
//! finishing endpoints ([`super::finish`]) share with them: lease tokens
//! verified before any database work, leases minted from claimed jobs.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use runlease_protocol::limits::{
    MAX_CLAIM_JOBS, MAX_CLAIM_QUEUES, MAX_LEASES_PER_REQUEST, MAX_WAIT_MS, storable_json,
};
use runlease_protocol::worker::{
    ClaimRequest, ClaimResponse, HeartbeatRequest, HeartbeatResponse, HeartbeatResult, HeartbeatStatus, Lease,
};
use runlease_protocol::{ErrorCode, JobId, LeaseToken, QueueName, RunLease, WorkerId};
use uuid::Uuid;

use crate::auth::{Action, Caller};
use crate::batch::claims::ClaimAsk;
use crate::http::error::ApiError;
use crate::http::extract::{JsonBody, require};
use crate::http::finish::NUL_REFUSED;
use crate::http::{AppState, views};
use crate::metrics::{ActionLabels, QueueLabels};
use crate::store::leases::{LeaseRef, Renewal};
use crate::store::rows::ClaimedJob;
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
pub(super) fn park(
    state: &AppState,
    caller: &Caller,
    ask: &ClaimAsk,
) -> Result<Option<crate::limits::Parking>, ApiError> {
    if ask.wait.is_zero() {
        return Ok(None);
    }
    // Claims of one shape share a statement: the shape, not the claim, is
    // what costs the database work.
    // Hashed with this process's random keys, so shapes that collide
    // cannot be worked out beforehand.
    static SHAPES: std::sync::OnceLock<std::collections::hash_map::RandomState> = std::sync::OnceLock::new();
    let mut hasher = std::hash::BuildHasher::build_hasher(SHAPES.get_or_init(Default::default));
    std::hash::Hash::hash(&crate::batch::plan::GroupKey::of(ask), &mut hasher);
    state
        .park_claim(caller, std::hash::Hasher::finish(&hasher))
        .map(Some)
}

/// Checks a claim (of `/v1/claim`, or riding on `/v1/finish`).
pub(super) fn claim_ask(caller: &Caller, req: ClaimRequest) -> Result<ClaimAsk, ApiError> {
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
pub(super) async fn hand_out(state: &AppState, ask: ClaimAsk) -> Result<Vec<Lease>, ApiError> {
    let worker = ask.worker.clone();
    let records = state.claims.claim(ask).await?;
    let records = fit_answer(state, &worker, records).await;
    Ok(leases_of(state, &worker, records))
}

/// The claimed jobs that fit in one answer (`RUNLEASE_MAX_ANSWER_BYTES`,
/// and always the first); the rest are given back at once, no attempt
/// charged, for the next claim to take.
pub(super) async fn fit_answer(
    state: &AppState,
    worker: &WorkerId,
    mut records: Vec<ClaimedJob>,
) -> Vec<ClaimedJob> {
    let mut bytes = 0;
    let mut fit = 0;
    for job in &records {
        let size = job.answer_bytes();
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
        // Boxed: a statement's future, which would otherwise size every
        // parked claim's future for this rare path.
        Box::pin(crate::batch::claims::release_unwanted(
            &state.store,
            &state.wake,
            worker,
            rest,
        ))
        .await;
    }
    records
}

/// Mints a lease of each job claimed for `worker`.
pub(super) fn leases_of(state: &AppState, worker: &WorkerId, records: Vec<ClaimedJob>) -> Vec<Lease> {
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
                dependencies: job.dependencies.into_iter().map(views::lease_dependency).collect(),
            }
        })
        .collect()
}

/// Verifies a token. Malformed: 400 for the whole request. Forged: `None`,
/// counted, and answered `lease_lost` by the caller. A token of a job whose
/// queue the caller's key may not use: 403 for the whole request.
pub(super) fn verify(
    state: &AppState,
    caller: &Caller,
    token: &LeaseToken,
) -> Result<Option<LeaseRef>, ApiError> {
    match state.tokens.verify_scoped(token) {
        // A token from before tokens named their queue, with a key limited
        // to some queues: its queue cannot be checked. While a rolling
        // upgrade is under way (this coordinator mints such tokens too) it
        // is honoured; otherwise that item is answered lease_lost (the job
        // runs again after its lease expires), the request's other items
        // as usual.
        Ok(claims) if claims.queue.is_none() && caller.queues.is_some() => {
            if state.tokens.mints_v1() {
                Ok(Some(claims.lease))
            } else {
                tracing::warn!("refused a lease token without its queue for a key limited to some queues");
                Ok(None)
            }
        }
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
/// name one of its queues.
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
        // Handled by `verify`.
        None => Ok(()),
    }
}

/// Counts a lease refused as stale (or forged) by `action` (`complete`,
/// `fail`, `release` or `heartbeat`).
pub(crate) fn count_lease_lost(state: &AppState, action: &str) {
    state
        .metrics
        .lease_lost
        .get_or_create(&ActionLabels {
            action: action.to_owned(),
        })
        .inc();
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
            count_lease_lost(&state, "heartbeat");
        }
        answers.push(HeartbeatResult {
            job_id,
            run_lease,
            status,
        });
    }
    Ok(Json(HeartbeatResponse { leases: answers }))
}
