//! One request: the job pushed to its queue's endpoint under its lease.
//! While the request is open the lease is renewed; a cancel (seen at a
//! renewal) or a lost lease aborts it. The answer is decided by
//! [`crate::endpoint::answer`] and written with the lease's guard through
//! the [`Finisher`](crate::batch::Finisher), as a worker's outcome is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runlease_protocol::worker::HeartbeatStatus;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::batch::FinishWork;
use crate::endpoint::answer::{self, Decision, Ended, Reply};
use crate::endpoint::client::Request;
use crate::endpoint::health::Change;
use crate::endpoint::metrics::EndpointMetrics;
use crate::endpoint::queue::{OpenRequest, QueueDispatcher};
use crate::endpoint::sign;
use crate::http::finish::finished_effects;
use crate::http::leases::count_lease_lost;
use crate::store::leases::{Ending, LeaseRef, Outcome, Renewal};
use crate::store::queues::{EndpointKeys, EndpointSetting};
use crate::store::rows::ClaimedJob;

/// How an open request ended before its answer.
enum Open {
    /// It was answered (or timed out, or never connected).
    Replied(Reply, Duration),
    /// The lease was lost or a cancel requested while it was open.
    Aborted(Ended),
    /// The coordinator is stopping, or the endpoint was removed.
    Stopped,
}

/// Sends `job` to its queue's endpoint and applies what comes back.
pub(super) async fn send(
    queue: Arc<QueueDispatcher>,
    job: ClaimedJob,
    open: OpenRequest,
    stop: tokio_util::sync::CancellationToken,
) {
    let span = tracing::info_span!(
        "endpoint_request",
        queue = %job.queue,
        job_id = %job.id,
        run_lease = job.run_lease.0,
        trace_id = tracing::field::Empty,
        traceparent = tracing::field::Empty,
    );
    if let Some(tp) = &job.traceparent {
        crate::telemetry::join_trace(&span, tp);
    }
    async move {
        let lease = LeaseRef {
            job_id: job.id,
            run_lease: job.run_lease,
            worker_id: queue.endpoints.worker.clone(),
        };
        let endpoint = queue.endpoints.state.flow.endpoint(&queue.queue);
        let (setting, keys) = match (endpoint, queue.health.paused_for()) {
            (Some((setting, Some(keys))), None) => (setting, keys),
            // Removed, without a secret, or backing off meanwhile: given back uncharged.
            (_, pause) => {
                let delay = pause.map(|p| p.as_millis() as i64);
                let _ = finish(
                    &queue,
                    &lease,
                    Outcome::Release {
                        progress: None,
                        delay_ms: delay,
                    },
                )
                .await;
                return;
            }
        };
        let opened = tokio::select! {
            replied = exchange(&queue, &job, &setting, &keys) => replied,
            ended = hold(&queue, &lease) => Open::Aborted(ended),
            () = stop.cancelled() => Open::Stopped,
        };
        settle(&queue, &lease, opened).await;
        // Room for another only once the outcome is written: until then the
        // job still runs as far as the claim's limits can see.
        drop(open);
    }
    .instrument(span)
    .await;
}

/// Signs and sends the request; answers what came back and how long it took.
async fn exchange(
    queue: &QueueDispatcher,
    job: &ClaimedJob,
    setting: &EndpointSetting,
    keys: &EndpointKeys,
) -> Open {
    let body = body_of(queue, job);
    let id = format!("{}:{}", job.id, job.run_lease.0);
    let timestamp = chrono::Utc::now().timestamp();
    let signature = sign::signature(keys.live(), &id, timestamp, &body);
    let headers = vec![
        ("webhook-id", id),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signature),
        ("traceparent", traceparent_of(job)),
    ];
    // Never longer than the attempt may run: its lease cannot be renewed past it.
    let terms = queue.endpoints.state.store.lease_settings();
    let attempt = job.timeout_ms.map_or(terms.default_timeout, |t| {
        Duration::from_millis(u64::try_from(t).unwrap_or(0))
    });
    let timeout = Duration::from_millis(u64::try_from(setting.timeout_ms).unwrap_or(60_000)).min(attempt);
    let started = Instant::now();
    let reply = queue
        .endpoints
        .client
        .send(Request {
            url: &setting.url,
            headers,
            body,
            timeout,
        })
        .await;
    Open::Replied(reply, started.elapsed())
}

/// The request's body: the job, its lease, and where to finish it.
fn body_of(queue: &QueueDispatcher, job: &ClaimedJob) -> Vec<u8> {
    let state = &queue.endpoints.state;
    let terms = state.store.lease_settings();
    let token = state
        .tokens
        .mint(job.id, job.run_lease, &queue.endpoints.worker, &job.queue);
    let mut job_view = json!({
        "id": job.id,
        "queue": job.queue,
        "payload": job.payload,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "progress": job.progress,
    });
    if let (Some(tp), Value::Object(map)) = (&job.traceparent, &mut job_view) {
        map.insert("traceparent".into(), json!(tp));
    }
    if let (false, Value::Object(map)) = (job.dependencies.is_empty(), &mut job_view) {
        let deps: Vec<_> = job
            .dependencies
            .iter()
            .cloned()
            .map(crate::http::views::lease_dependency)
            .collect();
        map.insert("dependencies".into(), json!(deps));
    }
    let body = json!({
        "job": job_view,
        "lease": {
            "lease_token": token,
            "run_lease": job.run_lease,
            "lease_ttl_ms": terms.ttl.as_millis() as u64,
            "heartbeat_interval_ms": terms.heartbeat_interval.as_millis() as u64,
        },
        "coordinator_url": queue.endpoints.settings.coordinator_url,
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

/// The request's `traceparent`: a child of the job's trace, or a new trace.
fn traceparent_of(job: &ClaimedJob) -> String {
    let hex = |n: usize| {
        let mut bytes = vec![0u8; n];
        rand::fill(&mut bytes[..]);
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    match &job.traceparent {
        Some(tp) => format!(
            "00-{}-{}-{}",
            tp.trace_id(),
            hex(8),
            if tp.sampled() { "01" } else { "00" }
        ),
        None => format!("00-{}-{}-00", hex(16), hex(8)),
    }
}

/// Renews the lease every heartbeat interval while the request is open;
/// returns when it is lost or a cancel is requested.
async fn hold(queue: &QueueDispatcher, lease: &LeaseRef) -> Ended {
    let state = &queue.endpoints.state;
    let every = state.store.lease_settings().heartbeat_interval;
    loop {
        tokio::time::sleep(every).await;
        let renewal = Renewal {
            job_id: lease.job_id,
            run_lease: lease.run_lease,
            progress: None,
        };
        match state
            .renewer
            .submit(vec![renewal])
            .await
            .map(|s| s.first().copied())
        {
            Ok(Some(HeartbeatStatus::Renewed)) => {}
            Ok(Some(HeartbeatStatus::CancelRequested)) => return Ended::Cancelled,
            Ok(Some(HeartbeatStatus::LeaseLost) | None) => return Ended::LeaseLost,
            // The next renewal may get through before the lease expires.
            Err(e) => tracing::warn!(error = %e, "cannot renew an endpoint's lease; trying again"),
        }
    }
}

/// Applies how the request ended, and counts it.
async fn settle(queue: &QueueDispatcher, lease: &LeaseRef, opened: Open) {
    let metrics = &queue.endpoints.state.metrics.endpoint;
    let ended = match opened {
        Open::Replied(reply, took) => {
            metrics
                .seconds
                .get_or_create(&EndpointMetrics::queue(queue.queue.as_str()))
                .observe(took.as_secs_f64());
            let error = match &reply {
                Reply::NoConnection { error } => Some(error.clone()),
                _ => None,
            };
            let decision = answer::decide(reply, queue.health.next_backoff());
            note_health(queue, &decision, error).await;
            apply(queue, lease, decision).await
        }
        Open::Aborted(Ended::Cancelled) => {
            // Released with a cancel requested: the job is cancelled.
            give_back(queue, lease).await;
            Ended::Cancelled
        }
        Open::Aborted(ended) => ended,
        Open::Stopped => {
            // Given back uncharged: another coordinator (or this one, later) sends it again.
            give_back(queue, lease).await;
            return;
        }
    };
    // A completion or hand-off is routine; anything else is worth a line.
    job_event!(
        !matches!(ended, Ended::Completed | Ended::HandedOff),
        outcome = ended.as_str(),
        "endpoint request ended"
    );
    metrics.ended(queue.queue.as_str(), ended);
}

/// Writes the decision's outcome; answers how the request counts.
async fn apply(queue: &QueueDispatcher, lease: &LeaseRef, decision: Decision) -> Ended {
    let Some(outcome) = decision.outcome else {
        // A hand-off: the function holds the lease from now on.
        return decision.ended;
    };
    match finish(queue, lease, outcome).await {
        Some(true) => decision.ended,
        Some(false) => Ended::LeaseLost,
        // Not written: the lease expires and the reaper takes the job back.
        None => decision.ended,
    }
}

/// Records what the answer says of the endpoint's health: a pause, the
/// metric, and (on a change) the queue's figures.
async fn note_health(queue: &QueueDispatcher, decision: &Decision, no_connection: Option<String>) {
    let state = &queue.endpoints.state;
    let change = match decision.ended {
        Ended::NoConnection => queue.health.failed(),
        Ended::Busy => {
            queue.health.busy(decision.back_off.flatten());
            queue.health.answered()
        }
        _ => queue.health.answered(),
    };
    let gauge = state
        .metrics
        .endpoint
        .healthy
        .get_or_create(&EndpointMetrics::queue(queue.queue.as_str()))
        .clone();
    match change {
        Change::Unhealthy => {
            gauge.set(0);
            tracing::warn!(queue = %queue.queue, "endpoint unhealthy: connections failed {} times in a row", super::UNHEALTHY_AFTER);
        }
        Change::Recovered => {
            gauge.set(1);
        }
        Change::None => {}
    }
    let failed_job = match &decision.outcome {
        Some(Outcome::Fail { error, .. }) => Some(error.clone()),
        _ => None,
    };
    let error = no_connection.or(failed_job);
    if error.is_some() || change == Change::Recovered {
        let failed = decision.ended == Ended::NoConnection;
        if let Err(e) = state
            .store
            .note_endpoint_health(&queue.queue, failed, error.as_deref())
            .await
        {
            tracing::warn!(error = %e, "cannot record the endpoint's health");
        }
    }
}

/// Releases the job without charging its attempt (a cancel or a stopping
/// coordinator); what the finish answers is not needed.
async fn give_back(queue: &QueueDispatcher, lease: &LeaseRef) {
    let release = Outcome::Release {
        progress: None,
        delay_ms: None,
    };
    let _ = finish(queue, lease, release).await;
}

/// Writes `outcome` with the lease's guard: `Some(true)` applied,
/// `Some(false)` refused (the lease was lost; counted), `None` not written.
async fn finish(queue: &QueueDispatcher, lease: &LeaseRef, outcome: Outcome) -> Option<bool> {
    let state = &queue.endpoints.state;
    let action = outcome.action();
    let work = FinishWork::new(vec![(lease.clone(), outcome)], None);
    match state.finisher.submit(work).await {
        Ok(done) => match done.endings.into_iter().next() {
            Some(Ending::Applied(finished)) => {
                finished_effects(state, lease.run_lease, action, &finished);
                Some(true)
            }
            Some(Ending::Lost(_)) | None => {
                count_lease_lost(state, action.as_str());
                tracing::info!(%action, "the endpoint's lease was lost: its answer is refused");
                Some(false)
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, %action, "cannot write the endpoint's outcome; the lease will expire and the job run again");
            None
        }
    }
}
