//! Prometheus metrics: one counter family per job transition and failure
//! path, queue depth (read at scrape time), long-poll waiters, request
//! latency per route, pool use and the SLO share. Per-queue families are
//! [`Capped`]: at most `RUNLEASE_METRICS_MAX_QUEUES` queue label values
//! ([`queue_cap`]).

pub mod queue_cap;
mod register;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use runlease_protocol::JobState;
use runlease_protocol::worker::FinishAction;

pub use crate::metrics::queue_cap::{Capped, OVERFLOW_QUEUE, QueueCap, QueueLabelled};
use crate::store::OperationLabels;
use crate::store::rows::JobRow;

/// Default `RUNLEASE_METRICS_MAX_QUEUES`: distinct queue label values.
pub const DEFAULT_METRICS_MAX_QUEUES: usize = 100;

/// Label set of per-queue metrics.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    /// Queue name.
    pub queue: String,
}

/// Label set of queue depth.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DepthLabels {
    /// Queue name.
    pub queue: String,
    /// Job state.
    pub state: String,
}

/// Label set of claims held back by a limit.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// Queue name.
    pub queue: String,
    /// `max_running`, `max_running_per_key` or `rate_limit`.
    pub limit: String,
}

impl QueueLabelled for QueueLabels {
    fn queue(&self) -> &str {
        &self.queue
    }
    fn with_queue(&self, queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
        }
    }
}

impl QueueLabelled for DepthLabels {
    fn queue(&self) -> &str {
        &self.queue
    }
    fn with_queue(&self, queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            state: self.state.clone(),
        }
    }
}

impl QueueLabelled for LimitLabels {
    fn queue(&self) -> &str {
        &self.queue
    }
    fn with_queue(&self, queue: &str) -> Self {
        Self {
            queue: queue.to_owned(),
            limit: self.limit.clone(),
        }
    }
}

/// Label set of refused finishing calls.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// heartbeat, complete, fail or release (refusals); retry, cancel or
    /// delete (bulk actions).
    pub action: String,
}

/// Label set of batch sizes.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BatchLabels {
    /// claim, finish or heartbeat.
    pub kind: String,
}

/// Label set of request latency.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// The route template, e.g. `/v1/jobs/{id}`.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Status class: 2xx, 4xx, 5xx.
    pub status: String,
}

fn batch_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 12))
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Label set of connections closed by their deadline.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabels {
    /// `header`: a request head did not arrive in time; `idle`: no request came.
    pub phase: &'static str,
}

/// Label set of requests refused by a limit.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// Which limit: `parked_claims`, `parked_reads`, `answer_bytes`,
    /// `cross_origin`, `host`, `malformed` (an HTTP/1.1 head or framing that
    /// cannot be read), `head_bytes` (a head over 64 KiB).
    pub limit: &'static str,
}

/// Every metric of the coordinator.
pub struct Metrics {
    /// HTTP connections open.
    pub connections_open: Gauge,
    /// Connections refused because `RUNLEASE_MAX_CONNECTIONS` were open
    /// and none was idle.
    pub connections_refused: Counter,
    /// Idle connections closed to make room for a new one at the cap.
    pub connections_evicted: Counter,
    /// Connections closed by the header or idle deadline.
    pub connections_timed_out: Family<TimeoutLabels, Counter>,
    /// Requests refused by a limit of the coordinator (not a flow-control
    /// limit of a queue).
    pub requests_refused: Family<RefusedLabels, Counter>,
    registry: Registry,
    /// The bound on queue label values, shared by every per-queue family.
    pub queue_cap: Arc<QueueCap>,
    /// The endpoint families (`runlease_endpoint_*`).
    pub endpoint: crate::endpoint::metrics::EndpointMetrics,
    /// Jobs enqueued (new, not idempotent repeats).
    pub enqueued: Capped<QueueLabels, Counter>,
    /// Leases handed out.
    pub claimed: Capped<QueueLabels, Counter>,
    /// Jobs completed.
    pub completed: Capped<QueueLabels, Counter>,
    /// Jobs that ended `failed`.
    pub failed: Capped<QueueLabels, Counter>,
    /// Failed or expired attempts after which the job was queued again.
    pub retried: Capped<QueueLabels, Counter>,
    /// Jobs that ended `cancelled`.
    pub cancelled: Capped<QueueLabels, Counter>,
    /// Leases given back by their worker.
    pub released: Capped<QueueLabels, Counter>,
    /// Blocked jobs queued when their last dependency ended.
    pub unblocked: Capped<QueueLabels, Counter>,
    /// Blocked jobs cancelled because a dependency failed.
    pub dependency_cancels: Capped<QueueLabels, Counter>,
    /// Leases the reaper took back.
    pub leases_expired: Capped<QueueLabels, Counter>,
    /// Worker calls refused as `lease_lost`.
    pub lease_lost: Family<ActionLabels, Counter>,
    /// Tokens that failed verification (malformed or forged).
    pub forged_tokens: Counter,
    /// Jobs marked `enqueue_failed` because their wake-up could not be sent.
    pub enqueue_failed_marks: Capped<QueueLabels, Counter>,
    /// `enqueue_failed` jobs the repair loop moved back to `queued`.
    pub enqueue_failed_repairs: Capped<QueueLabels, Counter>,
    /// Jobs per queue and state, read from PostgreSQL at scrape time.
    pub depth: Capped<DepthLabels, Gauge>,
    /// Age of the oldest due claimable job per queue, seconds.
    pub oldest_queued_age: Capped<QueueLabels, Gauge<f64, AtomicU64>>,
    /// How old the queue figures of the last scrape were, seconds (0: read
    /// for it; more while reads are slow and a background read serves them).
    pub queue_figures_age: Gauge<f64, AtomicU64>,
    /// Claims parked in a long-poll right now.
    pub claim_waiters: Gauge,
    /// Job reads parked in a long-poll right now.
    pub job_waiters: Gauge,
    /// Request duration per route.
    pub request_duration: Family<RouteLabels, Histogram, fn() -> Histogram>,
    /// Requests (claim slots, for claims) written per statement.
    pub batch_size: Family<BatchLabels, Histogram, fn() -> Histogram>,
    /// Finishing or heartbeat requests handed to their batcher and not yet
    /// being written (waiting for a flusher or for company).
    pub batch_gathering: Family<BatchLabels, Gauge>,
    /// Connections in the pool.
    pub pool_size: Gauge,
    /// Idle connections in the pool.
    pub pool_available: Gauge,
    /// Requests waiting for a pooled connection.
    pub pool_waiting: Gauge,
    /// Requests answered 503 because the database was unavailable.
    pub db_unavailable: Counter,
    /// Reaper passes that failed.
    pub reaper_errors: Counter,
    /// Jobs enqueued by schedules, per queue.
    pub schedule_fires: Capped<QueueLabels, Counter>,
    /// Schedule passes that failed.
    pub schedule_errors: Counter,
    /// Claim passes in which a limit held back at least one slot.
    pub claims_held_back: Capped<LimitLabels, Counter>,
    /// Refreshes of the flow-control view that failed.
    pub flow_refresh_errors: Counter,
    /// Database operations that ran past their deadline, per operation.
    pub db_timeouts: Family<OperationLabels, Counter>,
    /// Database operations retried after a deadlock or serialization failure, per operation.
    pub db_retries: Family<OperationLabels, Counter>,
    /// Terminal jobs deleted by retention, per queue and state.
    pub jobs_pruned: Capped<DepthLabels, Counter>,
    /// Prune passes (or tally folds) that failed.
    pub prune_errors: Counter,
    /// Recounts of the terminal tallies, each after changes of jobs made
    /// outside the coordinator's statements.
    pub tally_recounts: Counter,
    /// Attempts deleted by a recount because their job was gone (deleted
    /// outside the coordinator's statements).
    pub attempts_swept: Counter,
    /// Jobs changed by bulk actions, per action.
    pub bulk_changed: Family<ActionLabels, Counter>,
    /// Queue settings changed, per queue.
    pub settings_changes: Capped<QueueLabels, Counter>,
    /// Jobs that failed for good and left a follow-up on their queue's
    /// dead-letter queue, per (failed job's) queue.
    pub dead_letters: Capped<QueueLabels, Counter>,
    /// Wake-ups that could not be published to Redis.
    pub redis_publish_failures: Counter,
    /// Claim floors the floor check found above a claimable job.
    pub claim_floor_misses: Counter,
    /// Claims that parked without a statement: their queues were known to
    /// hold no claimable job.
    pub claims_parked_unlooked: Counter,
    /// SQS wake-up messages sent.
    pub sqs_wakeups_sent: Capped<QueueLabels, Counter>,
    /// SQS sends that failed (their jobs are signalled again next pass).
    pub sqs_send_failures: Capped<QueueLabels, Counter>,
    /// SQS sends that went through after an earlier one failed.
    pub sqs_send_retries: Capped<QueueLabels, Counter>,
    /// Jobs that reached a terminal state.
    pub terminal: Capped<QueueLabels, Counter>,
    /// Jobs that reached a terminal state within the SLO.
    pub terminal_within_slo: Capped<QueueLabels, Counter>,
    /// Share of terminal jobs that met the SLO, since start.
    pub slo_ratio: Gauge<f64, AtomicU64>,
    slo_counted: Counter,
    slo_met: Counter,
    slo: Duration,
}

impl Metrics {
    /// Registers every metric; `slo` is `RUNLEASE_SLO_MS`; queue labels
    /// capped at [`DEFAULT_METRICS_MAX_QUEUES`].
    pub fn new(slo: Duration) -> Self {
        Self::with_max_queues(slo, DEFAULT_METRICS_MAX_QUEUES)
    }

    /// Registers every metric; `slo` is `RUNLEASE_SLO_MS`, `max_queues`
    /// `RUNLEASE_METRICS_MAX_QUEUES`.
    pub fn with_max_queues(slo: Duration, max_queues: usize) -> Self {
        let mut registry = Registry::with_prefix("runlease");
        let cap = Arc::new(QueueCap::new(max_queues));
        let m = Self {
            connections_open: Gauge::default(),
            connections_refused: Counter::default(),
            connections_evicted: Counter::default(),
            connections_timed_out: Family::default(),
            requests_refused: Family::default(),
            queue_cap: cap.clone(),
            endpoint: crate::endpoint::metrics::EndpointMetrics::new(&cap),
            registry: Registry::default(),
            enqueued: Capped::new(cap.clone()),
            claimed: Capped::new(cap.clone()),
            completed: Capped::new(cap.clone()),
            failed: Capped::new(cap.clone()),
            retried: Capped::new(cap.clone()),
            cancelled: Capped::new(cap.clone()),
            released: Capped::new(cap.clone()),
            unblocked: Capped::new(cap.clone()),
            dependency_cancels: Capped::new(cap.clone()),
            leases_expired: Capped::new(cap.clone()),
            lease_lost: Family::default(),
            forged_tokens: Counter::default(),
            enqueue_failed_marks: Capped::new(cap.clone()),
            enqueue_failed_repairs: Capped::new(cap.clone()),
            depth: Capped::new(cap.clone()),
            oldest_queued_age: Capped::new(cap.clone()),
            queue_figures_age: Gauge::default(),
            claim_waiters: Gauge::default(),
            job_waiters: Gauge::default(),
            request_duration: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            batch_size: Family::new_with_constructor(batch_histogram as fn() -> Histogram),
            batch_gathering: Family::default(),
            pool_size: Gauge::default(),
            pool_available: Gauge::default(),
            pool_waiting: Gauge::default(),
            db_unavailable: Counter::default(),
            reaper_errors: Counter::default(),
            db_timeouts: Family::default(),
            db_retries: Family::default(),
            claims_held_back: Capped::new(cap.clone()),
            schedule_fires: Capped::new(cap.clone()),
            schedule_errors: Counter::default(),
            flow_refresh_errors: Counter::default(),
            jobs_pruned: Capped::new(cap.clone()),
            prune_errors: Counter::default(),
            tally_recounts: Counter::default(),
            attempts_swept: Counter::default(),
            bulk_changed: Family::default(),
            settings_changes: Capped::new(cap.clone()),
            dead_letters: Capped::new(cap.clone()),
            redis_publish_failures: Counter::default(),
            claim_floor_misses: Counter::default(),
            claims_parked_unlooked: Counter::default(),
            sqs_wakeups_sent: Capped::new(cap.clone()),
            sqs_send_failures: Capped::new(cap.clone()),
            sqs_send_retries: Capped::new(cap.clone()),
            terminal: Capped::new(cap.clone()),
            terminal_within_slo: Capped::new(cap.clone()),
            slo_ratio: Gauge::default(),
            slo_counted: Counter::default(),
            slo_met: Counter::default(),
            slo,
        };
        m.register_0(&mut registry);
        m.register_1(&mut registry);
        m.register_2(&mut registry);
        m.register_3(&mut registry);
        m.endpoint.register(&mut registry);
        Self { registry, ..m }
    }

    /// Records the size of a batch of `kind`.
    pub fn batch(&self, kind: &str, size: usize) {
        self.batch_size
            .get_or_create(&BatchLabels {
                kind: kind.to_owned(),
            })
            .observe(size as f64);
    }

    /// Counts a job's arrival in a terminal state against the SLO.
    pub fn job_terminal(&self, job: &JobRow) {
        self.terminal_at(job.queue.as_str(), job.created_at, job.finished_at);
    }

    /// Counts the arrival in a terminal state at `finished` of a job of
    /// `queue` enqueued at `created`, against the SLO.
    pub fn terminal_at(&self, queue: &str, created: DateTime<Utc>, finished: Option<DateTime<Utc>>) {
        let Some(finished) = finished else {
            return;
        };
        let labels = QueueLabels {
            queue: queue.to_owned(),
        };
        self.terminal.get_or_create(&labels).inc();
        self.slo_counted.inc();
        let took = (finished - created).to_std().unwrap_or_default();
        if took <= self.slo {
            self.terminal_within_slo.get_or_create(&labels).inc();
            self.slo_met.inc();
        }
    }

    /// Counts the transition a job just made into `job.state`; `via` tells
    /// transitions to the same state apart.
    pub fn transition(&self, job: &JobRow, via: Via) {
        self.transition_of(
            job.queue.as_str(),
            job.state,
            job.created_at,
            job.finished_at,
            via,
        );
    }

    /// A job of `queue` failed for good and enqueued its follow-up `dead_letter`:
    /// counted, logged and woken like an enqueue (best effort: claims of the
    /// dead-letter queue also find it on their timer).
    pub fn dead_lettered(
        &self,
        wake: &crate::wake::Wake,
        failed: runlease_protocol::JobId,
        queue: &runlease_protocol::QueueName,
        dead_letter: &crate::store::retry::DeadLetter,
    ) {
        self.dead_letters
            .get_or_create(&QueueLabels {
                queue: queue.to_string(),
            })
            .inc();
        tracing::info!(job_id = %failed, %queue, dead_letter_id = %dead_letter.id,
                       dead_letter_queue = %dead_letter.queue, "job failed for good: follow-up enqueued on the dead-letter queue");
        wake.ready(&dead_letter.queue);
    }

    /// [`Metrics::transition`] from the fields it needs: the job's queue, its
    /// new state, when it was enqueued and when it became terminal.
    pub fn transition_of(
        &self,
        queue: &str,
        state: JobState,
        created: DateTime<Utc>,
        finished: Option<DateTime<Utc>>,
        via: Via,
    ) {
        let labels = QueueLabels {
            queue: queue.to_owned(),
        };
        match (via, state) {
            (Via::Dependency, JobState::Queued) => {
                self.unblocked.get_or_create(&labels).inc();
            }
            (Via::Dependency, _) => {
                self.dependency_cancels.get_or_create(&labels).inc();
            }
            (Via::Worker(FinishAction::Release), JobState::Queued) => {
                self.released.get_or_create(&labels).inc();
            }
            (Via::Reap, JobState::Queued) => {
                self.leases_expired.get_or_create(&labels).inc();
                self.retried.get_or_create(&labels).inc();
            }
            (Via::Reap, _) => {
                self.leases_expired.get_or_create(&labels).inc();
            }
            (_, JobState::Queued) => {
                self.retried.get_or_create(&labels).inc();
            }
            _ => {}
        }
        match state {
            JobState::Done => {
                self.completed.get_or_create(&labels).inc();
            }
            JobState::Failed => {
                self.failed.get_or_create(&labels).inc();
            }
            JobState::Cancelled => {
                self.cancelled.get_or_create(&labels).inc();
            }
            _ => {}
        }
        if state.is_terminal() {
            self.terminal_at(queue, created, finished);
        }
    }

    /// Renders the Prometheus text (OpenMetrics) exposition.
    pub fn render(&self) -> String {
        let total = self.slo_counted.get();
        let met = self.slo_met.get();
        self.slo_ratio.set(if total == 0 {
            1.0
        } else {
            met as f64 / total as f64
        });
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// What caused a transition, where the resulting state alone does not tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// A worker's complete, fail or release.
    Worker(FinishAction),
    /// The reaper.
    Reap,
    /// A producer's cancel.
    Cancel,
    /// The end of the job's dependencies (queued from `blocked`, or
    /// cancelled by a failed one).
    Dependency,
}

/// Counts a parked long-poll for as long as it lives.
pub struct WaiterGauge<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> WaiterGauge<'a> {
    /// Counts one more waiter until dropped.
    pub fn new(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Self(gauge)
    }
}

impl Drop for WaiterGauge<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
