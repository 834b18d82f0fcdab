//! Registering every metric of [`Metrics`] under its name and help text,
//! in parts of a manageable length.

use prometheus_client::registry::Registry;

use super::Metrics;

impl Metrics {
    /// Registers the first part of the metrics (one function of a manageable length per part).
    pub(super) fn register_0(&self, registry: &mut Registry) {
        registry.register("jobs_enqueued", "Jobs enqueued", self.enqueued.clone());
        registry.register(
            "connections_open",
            "HTTP connections open",
            self.connections_open.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections refused because RUNLEASE_MAX_CONNECTIONS were open and none was idle",
            self.connections_refused.clone(),
        );
        registry.register(
            "connections_evicted",
            "Idle connections closed to make room for a new one at RUNLEASE_MAX_CONNECTIONS",
            self.connections_evicted.clone(),
        );
        registry.register(
            "connections_timed_out",
            "Connections closed because a request head (header) or any request (idle) did not arrive in time",
            self.connections_timed_out.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests refused by a limit of the coordinator (parked claims or reads, a cross-origin or foreign-host request in open mode)",
            self.requests_refused.clone(),
        );
        registry.register(
            "jobs_claimed",
            "Leases handed out by claims",
            self.claimed.clone(),
        );
        registry.register("jobs_completed", "Jobs completed", self.completed.clone());
        registry.register("jobs_failed", "Jobs that ended failed", self.failed.clone());
        registry.register(
            "jobs_retried",
            "Failed or expired attempts re-queued for another attempt",
            self.retried.clone(),
        );
        registry.register(
            "jobs_cancelled",
            "Jobs that ended cancelled",
            self.cancelled.clone(),
        );
        registry.register(
            "jobs_unblocked",
            "Blocked jobs queued when their last dependency ended",
            self.unblocked.clone(),
        );
        registry.register(
            "jobs_dependency_cancelled",
            "Blocked jobs cancelled because a dependency failed, was cancelled or was deleted",
            self.dependency_cancels.clone(),
        );
        registry.register(
            "jobs_released",
            "Leases released by their worker (no attempt charged)",
            self.released.clone(),
        );
        registry.register(
            "leases_expired",
            "Expired leases taken back by the reaper",
            self.leases_expired.clone(),
        );
        registry.register(
            "lease_lost",
            "Worker calls refused as lease_lost (stale, foreign or forged lease)",
            self.lease_lost.clone(),
        );
        registry.register(
            "forged_tokens",
            "Lease tokens refused before reaching PostgreSQL (malformed or bad MAC)",
            self.forged_tokens.clone(),
        );
    }

    /// Registers the second part of the metrics (one function of a manageable length per part).
    pub(super) fn register_1(&self, registry: &mut Registry) {
        registry.register(
            "enqueue_failed_marks",
            "Jobs marked enqueue_failed because their wake-up was not delivered",
            self.enqueue_failed_marks.clone(),
        );
        registry.register(
            "enqueue_failed_repairs",
            "enqueue_failed jobs moved back to queued by the repair loop",
            self.enqueue_failed_repairs.clone(),
        );
        registry.register(
            "queue_depth",
            "Jobs per queue and state (read at scrape time)",
            self.depth.clone(),
        );
        registry.register(
            "oldest_queued_age_seconds",
            "Age of the oldest due claimable job per queue",
            self.oldest_queued_age.clone(),
        );
        registry.register(
            "queue_figures_age_seconds",
            "How old the queue figures of the last scrape were (0: read for it)",
            self.queue_figures_age.clone(),
        );
        registry.register(
            "claim_waiters",
            "Claims parked in a long-poll",
            self.claim_waiters.clone(),
        );
        registry.register(
            "job_waiters",
            "Job reads parked in a long-poll",
            self.job_waiters.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "HTTP request duration per route",
            self.request_duration.clone(),
        );
        registry.register(
            "redis_publish_failures",
            "Wake-ups that could not be published to Redis",
            self.redis_publish_failures.clone(),
        );
        registry.register(
            "sqs_wakeups_sent",
            "SQS wake-up messages sent",
            self.sqs_wakeups_sent.clone(),
        );
        registry.register(
            "sqs_send_failures",
            "SQS wake-up sends that failed (sent again next pass)",
            self.sqs_send_failures.clone(),
        );
        registry.register(
            "sqs_send_retries",
            "SQS wake-up sends that went through after an earlier failure",
            self.sqs_send_retries.clone(),
        );
        registry.register(
            "batch_size",
            "Requests (claim slots, for claims) written per statement",
            self.batch_size.clone(),
        );
        registry.register(
            "batch_gathering",
            "Finishing or heartbeat requests gathered for their next batch, not yet being written",
            self.batch_gathering.clone(),
        );
        registry.register(
            "db_pool_size",
            "PostgreSQL connections in the pool",
            self.pool_size.clone(),
        );
    }

    /// Registers the third part of the metrics (one function of a manageable length per part).
    pub(super) fn register_2(&self, registry: &mut Registry) {
        registry.register(
            "db_pool_available",
            "Idle PostgreSQL connections in the pool",
            self.pool_available.clone(),
        );
        registry.register(
            "db_pool_waiting",
            "Requests waiting for a PostgreSQL connection",
            self.pool_waiting.clone(),
        );
        registry.register(
            "db_unavailable",
            "Requests answered 503 because PostgreSQL was unavailable",
            self.db_unavailable.clone(),
        );
        registry.register(
            "schedule_fires",
            "Jobs enqueued by schedules (one per fire time)",
            self.schedule_fires.clone(),
        );
        registry.register(
            "schedule_errors",
            "Schedule passes that failed (retried)",
            self.schedule_errors.clone(),
        );
        registry.register(
            "claims_held_back",
            "Claim passes in which a flow-control limit held back at least one slot",
            self.claims_held_back.clone(),
        );
        registry.register(
            "flow_refresh_errors",
            "Refreshes of the flow-control view (queue settings) that failed",
            self.flow_refresh_errors.clone(),
        );
        registry.register(
            "db_timeouts",
            "Database operations that ran past their deadline (the connection is thrown away)",
            self.db_timeouts.clone(),
        );
        registry.register(
            "db_retries",
            "Database operations retried after a deadlock, a serialization failure, a read-only server or a schema change under prepared statements",
            self.db_retries.clone(),
        );
        registry.register(
            "reaper_errors",
            "Reaper passes that failed",
            self.reaper_errors.clone(),
        );
        registry.register(
            "jobs_pruned",
            "Terminal jobs deleted by retention",
            self.jobs_pruned.clone(),
        );
        registry.register(
            "prune_errors",
            "Prune passes or tally folds that failed",
            self.prune_errors.clone(),
        );
        registry.register(
            "tally_recounts",
            "Recounts of the terminal tallies after changes of jobs made outside the coordinator",
            self.tally_recounts.clone(),
        );
        registry.register(
            "attempts_swept",
            "Attempts deleted by a recount because their job had been deleted outside the coordinator",
            self.attempts_swept.clone(),
        );
    }

    /// Registers the fourth part of the metrics (one function of a manageable length per part).
    pub(super) fn register_3(&self, registry: &mut Registry) {
        registry.register(
            "claim_floor_misses",
            "Claim floors found above a claimable job, or queues marked empty found holding one (written without a wake-up reaching this coordinator), and corrected",
            self.claim_floor_misses.clone(),
        );
        registry.register(
            "claims_parked_unlooked",
            "Claims that parked without a statement: their queues were known to hold no claimable job",
            self.claims_parked_unlooked.clone(),
        );
        registry.register(
            "bulk_changed",
            "Jobs changed by bulk actions (retry, cancel, delete)",
            self.bulk_changed.clone(),
        );
        registry.register(
            "queue_settings_changes",
            "Changes of queue settings (pause, limits, retention, retry policy)",
            self.settings_changes.clone(),
        );
        registry.register(
            "dead_letters",
            "Jobs failed for good that enqueued a follow-up on their queue's dead-letter queue",
            self.dead_letters.clone(),
        );
        registry.register(
            "jobs_terminal",
            "Jobs that reached a terminal state",
            self.terminal.clone(),
        );
        registry.register(
            "jobs_terminal_within_slo",
            "Jobs terminal within RUNLEASE_SLO_MS of enqueue",
            self.terminal_within_slo.clone(),
        );
        registry.register(
            "metrics_queue_labels",
            "Distinct queue label values in use (at most RUNLEASE_METRICS_MAX_QUEUES, the overflow value not counted)",
            self.queue_cap.labels.clone(),
        );
        registry.register(
            "metrics_queue_overflow",
            "Observations of queues past RUNLEASE_METRICS_MAX_QUEUES, recorded under queue=\"(other)\"",
            self.queue_cap.overflowed.clone(),
        );
        registry.register(
            "slo_ratio",
            "Share of terminal jobs that met the SLO since this process started",
            self.slo_ratio.clone(),
        );
    }
}
