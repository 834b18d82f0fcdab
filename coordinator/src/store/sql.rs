//! Every SQL statement of the coordinator, each in its own file under `sql/`.

/// Enqueue jobs (multi-row insert from arrays).
pub const JOB_ENQUEUE: &str = include_str!("sql/job_enqueue.sql");
/// Read jobs by (queue, idempotency key).
pub const JOB_GET_BY_IDEMPOTENCY_KEY: &str = include_str!("sql/job_get_by_idempotency_key.sql");
/// Read jobs by id.
pub const JOB_GET: &str = include_str!("sql/job_get.sql");
/// Cancel jobs.
pub const JOB_CANCEL: &str = include_str!("sql/job_cancel.sql");
/// Admin retry of failed or cancelled jobs.
pub const JOB_RETRY: &str = include_str!("sql/job_retry.sql");
/// Mark jobs whose wake-up was not delivered.
pub const JOB_MARK_ENQUEUE_FAILED: &str = include_str!("sql/job_mark_enqueue_failed.sql");
/// Lock enqueue_failed jobs for a repair pass.
pub const JOB_REPAIR_PICK: &str = include_str!("sql/job_repair_pick.sql");
/// Move repaired jobs back to queued.
pub const JOB_REPAIR_REQUEUE: &str = include_str!("sql/job_repair_requeue.sql");
/// Take due, unsignalled jobs of an SQS-bound queue and mark them signalled.
pub const JOB_DISPATCH_PICK: &str = include_str!("sql/job_dispatch_pick.sql");
/// Give the due times of unsent wake-ups back.
pub const JOB_DISPATCH_UNMARK: &str = include_str!("sql/job_dispatch_unmark.sql");
/// The latest ended attempts of jobs.
pub const ATTEMPT_LIST: &str = include_str!("sql/attempt_list.sql");
/// A page of one job's ended attempts.
pub const ATTEMPT_PAGE: &str = include_str!("sql/attempt_page.sql");
/// Claim leases.
pub const LEASE_CLAIM: &str = include_str!("sql/lease_claim.sql");
/// What a claim's transaction sets before `LEASE_CLAIM` (one literal for
/// the two constants below).
macro_rules! lease_claim_settings {
    () => {
        concat!(
            "SET LOCAL plan_cache_mode = force_generic_plan; \
             SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; ",
            tallied!()
        )
    };
}
/// Marks a transaction whose statements keep the tallies right
/// themselves: each writes its own deltas, or changes no terminal state
/// (migrations 7 and 8), and counts the attempts it writes in the attempt
/// tallies, or writes none that count (`lease_finish.sql`,
/// `lease_reap.sql`; migration 10). An update of `state` or `queue`
/// outside such a transaction asks for the tallies to be counted again;
/// attempts written outside one are counted by a trigger.
macro_rules! tallied {
    () => {
        "SET LOCAL runlease.tallies = 'explicit'; SET LOCAL runlease.attempt_tallies = 'explicit'"
    };
}
/// Opens a transaction for a statement that sets `state` and keeps the
/// tallies right itself (`lease_reap.sql`, `job_cancel.sql`,
/// `job_retry.sql`, `job_mark_enqueue_failed.sql`; the finish runs under
/// [`LEASE_CLAIM_BEGIN`], which sets the same).
pub const TALLIED_BEGIN: &str = concat!("BEGIN; ", tallied!());
/// The mark of [`TALLIED_BEGIN`], for a transaction already open.
pub const TALLIED: &str = tallied!();
/// The marks of a transaction whose deletes of jobs take them off the
/// tallies (`runlease.tally_deletes`, migration 8: deletes have a mark of
/// their own, since a coordinator of version 7 deletes in transactions
/// marked [`TALLIED`] without writing deltas) and delete their attempts
/// (`runlease.job_deletes`, migration 9: a coordinator of version 8
/// counted on the foreign key's cascade) themselves: `job_prune.sql` and
/// `job_delete.sql`, each followed by `job_attempts_delete.sql`.
macro_rules! tallied_deletes {
    () => {
        concat!(
            tallied!(),
            "; SET LOCAL runlease.tally_deletes = 'explicit'; SET LOCAL runlease.job_deletes = 'explicit'"
        )
    };
}
/// [`TALLIED`] and the mark of deletes, for a transaction already open.
pub const TALLIED_DELETES: &str = tallied_deletes!();
/// What a claim's transaction sets before `LEASE_CLAIM`: its generic plan
/// (planned once per connection), joined by nested loops only; and the
/// mark of a transaction whose statements write their own tallies (the
/// finish runs in such a transaction).
pub const LEASE_CLAIM_SETTINGS: &str = lease_claim_settings!();
/// Opens a claim's own transaction with [`LEASE_CLAIM_SETTINGS`].
pub const LEASE_CLAIM_BEGIN: &str = concat!("BEGIN; ", lease_claim_settings!());
/// Claim leases of a queue limited per concurrency key.
pub const LEASE_CLAIM_KEYED: &str = include_str!("sql/lease_claim_keyed.sql");
/// Lock a queue's limits for a claim.
pub const QUEUE_LIMITS_LOCK: &str = include_str!("sql/queue_limits_lock.sql");
/// Running jobs of a queue.
pub const QUEUE_RUNNING_COUNT: &str = include_str!("sql/queue_running_count.sql");
/// Take tokens from a queue's rate-limit bucket.
pub const QUEUE_RATE_TAKE: &str = include_str!("sql/queue_rate_take.sql");
/// Renew leases.
pub const LEASE_HEARTBEAT: &str = include_str!("sql/lease_heartbeat.sql");
/// End leases: complete, fail or release, each item its own action.
pub const LEASE_FINISH: &str = include_str!("sql/lease_finish.sql");
/// What became of leases a finish did not match.
pub const LEASE_FINISH_MISSED: &str = include_str!("sql/lease_finish_missed.sql");
/// Reap expired leases.
pub const LEASE_REAP: &str = include_str!("sql/lease_reap.sql");
/// Live jobs per queue and state (indexes over live rows only).
pub const QUEUE_LIVE_COUNTS: &str = include_str!("sql/queue_live_counts.sql");
/// Terminal totals per queue, from the tallies.
pub const QUEUE_TALLIES: &str = include_str!("sql/queue_tallies.sql");
/// Jobs of queues that ended within a recent window.
pub const QUEUE_THROUGHPUT: &str = include_str!("sql/queue_throughput.sql");
/// Fold the tally deltas.
pub const JOB_TALLY_FOLD: &str = include_str!("sql/job_tally_fold.sql");
/// Count the terminal tallies again, if a change made outside the
/// coordinator asked for it.
pub const JOB_TALLY_RECOUNT: &str = include_str!("sql/job_tally_recount.sql");
/// Settings of queues.
pub const QUEUE_SETTINGS_LIST: &str = include_str!("sql/queue_settings_list.sql");
/// Change a queue's settings.
pub const QUEUE_SETTINGS_UPDATE: &str = include_str!("sql/queue_settings_update.sql");
/// A page of job ids of a queue, newest first.
pub const JOB_LIST: &str = include_str!("sql/job_list.sql");
/// Which of given jobs a bulk filter matches.
pub const JOB_MATCH: &str = include_str!("sql/job_match.sql");
/// Delete terminal jobs.
pub const JOB_DELETE: &str = include_str!("sql/job_delete.sql");
/// Delete the attempts of jobs just deleted.
pub const JOB_ATTEMPTS_DELETE: &str = include_str!("sql/job_attempts_delete.sql");
/// One batch of a sweep of attempts whose job is gone.
pub const JOB_ATTEMPTS_SWEEP: &str = include_str!("sql/job_attempts_sweep.sql");
/// Delete expired terminal jobs of a queue and state.
pub const JOB_PRUNE: &str = include_str!("sql/job_prune.sql");
/// The queues that hold terminal jobs.
pub const JOB_PRUNE_QUEUES: &str = include_str!("sql/job_prune_queues.sql");
/// An advisory lock by key: the prune lock (pruning and folding on one
/// replica at a time) or the recount lock.
pub const PRUNE_LOCK: &str = include_str!("sql/prune_lock.sql");

/// Due jobs a queue's settings keep from starting.
pub const QUEUE_HELD_BACK: &str = include_str!("sql/queue_held_back.sql");
/// Create or replace a schedule.
pub const SCHEDULE_PUT: &str = include_str!("sql/schedule_put.sql");
/// Read schedules.
pub const SCHEDULE_LIST: &str = include_str!("sql/schedule_list.sql");
/// Delete a schedule.
pub const SCHEDULE_DELETE: &str = include_str!("sql/schedule_delete.sql");
/// Lock due schedules.
pub const SCHEDULE_DUE: &str = include_str!("sql/schedule_due.sql");
/// Move a schedule to its next fire time.
pub const SCHEDULE_FIRED: &str = include_str!("sql/schedule_fired.sql");
/// PostgreSQL's clock.
pub const CLOCK_NOW: &str = include_str!("sql/clock_now.sql");

/// Every statement with its name, for the test that prepares them all.
pub const ALL: &[(&str, &str)] = &[
    ("job_enqueue", JOB_ENQUEUE),
    ("job_get_by_idempotency_key", JOB_GET_BY_IDEMPOTENCY_KEY),
    ("job_get", JOB_GET),
    ("job_cancel", JOB_CANCEL),
    ("job_retry", JOB_RETRY),
    ("job_mark_enqueue_failed", JOB_MARK_ENQUEUE_FAILED),
    ("job_repair_pick", JOB_REPAIR_PICK),
    ("job_repair_requeue", JOB_REPAIR_REQUEUE),
    ("job_dispatch_pick", JOB_DISPATCH_PICK),
    ("job_dispatch_unmark", JOB_DISPATCH_UNMARK),
    ("attempt_list", ATTEMPT_LIST),
    ("attempt_page", ATTEMPT_PAGE),
    ("lease_claim", LEASE_CLAIM),
    ("lease_claim_keyed", LEASE_CLAIM_KEYED),
    ("queue_limits_lock", QUEUE_LIMITS_LOCK),
    ("queue_running_count", QUEUE_RUNNING_COUNT),
    ("queue_rate_take", QUEUE_RATE_TAKE),
    ("lease_heartbeat", LEASE_HEARTBEAT),
    ("lease_finish", LEASE_FINISH),
    ("lease_finish_missed", LEASE_FINISH_MISSED),
    ("lease_reap", LEASE_REAP),
    ("queue_live_counts", QUEUE_LIVE_COUNTS),
    ("queue_tallies", QUEUE_TALLIES),
    ("queue_throughput", QUEUE_THROUGHPUT),
    ("job_tally_fold", JOB_TALLY_FOLD),
    ("job_tally_recount", JOB_TALLY_RECOUNT),
    ("queue_settings_list", QUEUE_SETTINGS_LIST),
    ("queue_settings_update", QUEUE_SETTINGS_UPDATE),
    ("job_list", JOB_LIST),
    ("job_match", JOB_MATCH),
    ("job_delete", JOB_DELETE),
    ("job_attempts_delete", JOB_ATTEMPTS_DELETE),
    ("job_attempts_sweep", JOB_ATTEMPTS_SWEEP),
    ("job_prune", JOB_PRUNE),
    ("job_prune_queues", JOB_PRUNE_QUEUES),
    ("prune_lock", PRUNE_LOCK),
    ("queue_held_back", QUEUE_HELD_BACK),
    ("schedule_put", SCHEDULE_PUT),
    ("schedule_list", SCHEDULE_LIST),
    ("schedule_delete", SCHEDULE_DELETE),
    ("schedule_due", SCHEDULE_DUE),
    ("schedule_fired", SCHEDULE_FIRED),
    ("clock_now", CLOCK_NOW),
];
