//! HTTP endpoints as workers: a queue with an endpoint is served by every
//! coordinator, which claims the queue's jobs itself (the same claim
//! statement and flow control as a pulled job) and pushes each to the
//! endpoint as a signed request, holding and renewing the lease while the
//! request is open; the answer decides the outcome ([`answer`]), written
//! with the lease's guard through the same finish path as a worker's.
//!
//! - [`guard`]: where an endpoint may point (checked on every connection).
//! - [`sign`]: endpoint secrets and Standard Webhooks signatures.
//! - [`client`]: the HTTP client (no redirects, bounded answers, timeouts).
//! - [`answer`]: the table of answers and outcomes.
//! - [`metrics`]: the `runlease_endpoint_*` metrics.
//! - `queue`, `request`, `health`: the dispatcher of one queue, one request,
//!   and an endpoint's backoff.

pub mod answer;
pub mod client;
pub mod guard;
pub mod metrics;
pub mod sign;

mod health;
mod queue;
mod request;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use runlease_protocol::{QueueName, WorkerId};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::EndpointConfig;
use crate::endpoint::client::EndpointClient;
use crate::endpoint::guard::AllowList;
use crate::http::AppState;

/// The worker id of every lease an endpoint holds (what `owned_by` and the
/// attempt chronology show, and what its lease tokens name).
pub const ENDPOINT_WORKER: &str = "runlease-endpoint";
/// Connection failures in a row after which an endpoint is shown unhealthy.
pub const UNHEALTHY_AFTER: u32 = 5;
pub use runlease_protocol::limits::{
    DEFAULT_ENDPOINT_CONCURRENCY as DEFAULT_CONCURRENCY, DEFAULT_ENDPOINT_TIMEOUT_MS as DEFAULT_TIMEOUT_MS,
    MAX_ENDPOINT_CONCURRENCY as MAX_CONCURRENCY, MAX_ENDPOINT_TIMEOUT_MS as MAX_TIMEOUT_MS,
    MIN_ENDPOINT_TIMEOUT_MS as MIN_TIMEOUT_MS,
};
/// How often the dispatcher looks for endpoints set or removed (the
/// flow-control view it reads is refreshed every second, and at once by a
/// PATCH on this coordinator).
const LOOK_INTERVAL: Duration = Duration::from_millis(200);

/// What the dispatchers work with, from the coordinator's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Hosts allowed to be internal (and plain http).
    pub allow: Arc<AllowList>,
    /// First pause after a connection failure.
    pub backoff: Duration,
    /// Longest pause.
    pub backoff_max: Duration,
    /// Sent as `coordinator_url`.
    pub coordinator_url: String,
}

impl Settings {
    /// From `RUNLEASE_ENDPOINT_*` and `RUNLEASE_PUBLIC_URL`; `listen` is
    /// the address the coordinator listens on (the default public URL).
    pub fn from_config(config: &EndpointConfig, listen: SocketAddr) -> Self {
        let public = config
            .public_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty());
        Self {
            allow: Arc::new(AllowList::parse(
                config.allow_hosts.as_deref().unwrap_or_default(),
            )),
            backoff: config.backoff,
            backoff_max: config.backoff_max.max(config.backoff),
            coordinator_url: public.map_or_else(
                || format!("http://{listen}"),
                |u| u.trim_end_matches('/').to_owned(),
            ),
        }
    }
}

/// The dispatchers of one coordinator: one loop per queue with an endpoint.
pub struct Endpoints {
    state: AppState,
    client: EndpointClient,
    settings: Settings,
    worker: WorkerId,
}

impl Endpoints {
    /// The dispatchers over the coordinator's handlers' state.
    pub fn new(state: AppState, settings: Settings) -> Result<Arc<Self>, String> {
        let client = EndpointClient::new(settings.allow.clone())?;
        let worker = WorkerId::new(ENDPOINT_WORKER).map_err(|e| e.to_string())?;
        Ok(Arc::new(Self {
            state,
            client,
            settings,
            worker,
        }))
    }

    /// Starts a dispatcher for each queue given an endpoint and stops the
    /// dispatcher of each queue whose endpoint is removed, until `cancel`.
    pub async fn run(self: Arc<Self>, tracker: TaskTracker, cancel: CancellationToken) {
        let mut serving: HashMap<QueueName, CancellationToken> = HashMap::new();
        loop {
            let wanted: Vec<QueueName> = self
                .state
                .flow
                .endpoints()
                .into_iter()
                .map(|(q, _, _)| q)
                .collect();
            serving.retain(|queue, stop| {
                let keep = wanted.contains(queue);
                if !keep {
                    tracing::info!(%queue, "endpoint removed: its dispatcher stops");
                    stop.cancel();
                }
                keep
            });
            for queue in wanted {
                if let std::collections::hash_map::Entry::Vacant(slot) = serving.entry(queue) {
                    let queue = slot.key().clone();
                    tracing::info!(%queue, "endpoint set: its dispatcher starts");
                    let stop = slot.insert(cancel.child_token()).clone();
                    let dispatcher = queue::QueueDispatcher::new(self.clone(), queue);
                    tracker.spawn(dispatcher.run(stop));
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(LOOK_INTERVAL) => {}
            }
        }
    }
}
