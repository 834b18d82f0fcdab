//! The metrics of endpoints: requests by outcome, their duration, what is
//! open and whether each endpoint is healthy. Queue labels are capped as
//! every per-queue family's are; `outcome` is one of [`Ended`]'s nine.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::endpoint::answer::Ended;
use crate::metrics::{Capped, QueueCap, QueueLabelled, QueueLabels};

/// Label set of endpoint requests: the queue and how the request ended.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// Queue name.
    pub queue: String,
    /// [`Ended::as_str`].
    pub outcome: String,
}

impl QueueLabelled for OutcomeLabels {
    fn queue(&self) -> &str {
        &self.queue
    }
    fn with_queue(&self, queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            ..self.clone()
        }
    }
}

fn seconds_histogram() -> Histogram {
    // 5 ms to about 20 minutes (timeout_ms reaches 15 minutes).
    Histogram::new(exponential_buckets(0.005, 2.0, 18))
}

/// The endpoint metric families.
#[derive(Debug, Clone)]
pub struct EndpointMetrics {
    /// `runlease_endpoint_requests_total{queue,outcome}`.
    pub requests: Capped<OutcomeLabels, Counter>,
    /// `runlease_endpoint_seconds{queue}`: from sending to the answer read.
    pub seconds: Capped<QueueLabels, Histogram>,
    /// `runlease_endpoint_in_flight{queue}`: requests open on this coordinator.
    pub in_flight: Capped<QueueLabels, Gauge>,
    /// `runlease_endpoint_healthy{queue}`: 0 after 5 connection failures in
    /// a row, 1 again after an answer.
    pub healthy: Capped<QueueLabels, Gauge>,
}

impl EndpointMetrics {
    /// Empty families whose queue labels `cap` bounds.
    pub fn new(cap: &Arc<QueueCap>) -> Self {
        Self {
            requests: Capped::new(cap.clone()),
            seconds: Capped::with_constructor(cap.clone(), seconds_histogram),
            in_flight: Capped::new(cap.clone()),
            healthy: Capped::new(cap.clone()),
        }
    }

    /// Registers the families in `registry` (prefixed `runlease_`).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "endpoint_requests",
            "Requests to queues' endpoints, by how they ended",
            self.requests.clone(),
        );
        registry.register(
            "endpoint_seconds",
            "Time from sending a request to an endpoint to its answer",
            self.seconds.clone(),
        );
        registry.register(
            "endpoint_in_flight",
            "Requests to endpoints open on this coordinator",
            self.in_flight.clone(),
        );
        registry.register(
            "endpoint_healthy",
            "1 while a queue's endpoint answers, 0 after 5 connection failures in a row",
            self.healthy.clone(),
        );
    }

    /// Counts a request of `queue` that ended as `ended`.
    pub fn ended(&self, queue: &str, ended: Ended) {
        self.requests
            .get_or_create(&OutcomeLabels {
                queue: queue.to_owned(),
                outcome: ended.as_str().to_owned(),
            })
            .inc();
    }

    /// The label set of `queue`.
    pub fn queue(queue: &str) -> QueueLabels {
        QueueLabels {
            queue: queue.to_owned(),
        }
    }
}
