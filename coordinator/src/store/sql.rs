//! Every SQL statement of the coordinator, each in its own file under `sql/`.
//! A statement that changes job states or deletes jobs is a
//! [`Changes`], declared with what its rows do to the tallies
//! ([`crate::store::tally`]).

use crate::store::tally::{self, Changes};

/// The server a connection reached and whether it takes writes (`/readyz`).
pub const SERVER_STATUS: &str = include_str!("sql/server_status.sql");
/// Enqueue jobs without idempotency keys (multi-row insert from arrays); a
/// job whose dependency already failed enters `cancelled`.
pub const JOB_ENQUEUE: Changes = Changes::new(
    concat!(
        include_str!("sql/job_enqueue.sql"),
        include_str!("sql/job_enqueue_returning.sql")
    ),
    tally::entered,
);
/// [`JOB_ENQUEUE`] for jobs of which some carry idempotency keys: a job
/// whose key exists is skipped.
pub const JOB_ENQUEUE_KEYED: Changes = Changes::new(
    concat!(
        include_str!("sql/job_enqueue.sql"),
        include_str!("sql/job_enqueue_keyed.sql"),
        include_str!("sql/job_enqueue_returning.sql")
    ),
    tally::entered,
);
/// Lock the existing dependencies of an enqueue and count its dependents.
pub const JOB_DEPENDENCIES_LOCK: &str = include_str!("sql/job_dependencies_lock.sql");
/// Record the dependency edges of enqueued jobs.
pub const JOB_DEPENDENCIES_INSERT: &str = include_str!("sql/job_dependencies_insert.sql");
/// The dependencies of jobs, with their states and results.
pub const JOB_DEPENDENCIES_OF: &str = include_str!("sql/job_dependencies_of.sql");
/// The dependents of jobs, with their states.
pub const JOB_DEPENDENTS_OF: &str = include_str!("sql/job_dependents_of.sql");
/// Settle the dependents of jobs an earlier statement of the transaction ended.
pub const JOB_DEPENDENTS_SETTLED: Changes =
    Changes::new(include_str!("sql/job_dependents_settled.sql"), tally::entered);
/// Enqueue the dead-letter follow-ups of jobs a finish failed for good.
pub const JOB_DEAD_LETTER: Changes = Changes::untallied(include_str!("sql/job_dead_letter.sql"));
/// Read jobs by (queue, idempotency key).
pub const JOB_GET_BY_IDEMPOTENCY_KEY: &str = include_str!("sql/job_get_by_idempotency_key.sql");
/// Read jobs by id.
pub const JOB_GET: &str = include_str!("sql/job_get.sql");
/// Cancel jobs.
pub const JOB_CANCEL: Changes = Changes::new(
    concat!(
        include_str!("sql/jobs_locked_by_id.sql"),
        include_str!("sql/job_cancel.sql")
    ),
    tally::entered,
);
/// Admin retry of failed or cancelled jobs.
pub const JOB_RETRY: Changes = Changes::new(include_str!("sql/job_retry.sql"), tally::retried);
/// Mark jobs whose wake-up was not delivered.
pub const JOB_MARK_ENQUEUE_FAILED: Changes =
    Changes::untallied(include_str!("sql/job_mark_enqueue_failed.sql"));
/// Lock enqueue_failed jobs for a repair pass.
pub const JOB_REPAIR_PICK: &str = include_str!("sql/job_repair_pick.sql");
/// Move repaired jobs back to queued.
pub const JOB_REPAIR_REQUEUE: Changes = Changes::untallied(include_str!("sql/job_repair_requeue.sql"));
/// Take due, unsignalled jobs of an SQS-bound queue and mark them signalled.
pub const JOB_DISPATCH_PICK: &str = include_str!("sql/job_dispatch_pick.sql");
/// Give the due times of unsent wake-ups back.
pub const JOB_DISPATCH_UNMARK: &str = include_str!("sql/job_dispatch_unmark.sql");
/// The latest ended attempts of jobs.
pub const ATTEMPT_LIST: &str = include_str!("sql/attempt_list.sql");
/// A page of one job's ended attempts.
pub const ATTEMPT_PAGE: &str = include_str!("sql/attempt_page.sql");
/// Claim leases.
pub const LEASE_CLAIM: Changes = Changes::untallied(include_str!("sql/lease_claim.sql"));
/// The first claimable job of queues from where a claim's scan starts
/// (the claim floors, store/floors.rs).
pub const LEASE_CLAIM_FLOOR: &str = include_str!("sql/lease_claim_floor.sql");
/// How a claim's statement is planned, set local in its transaction: its
/// generic plan (planned once per connection instead of at every claim),
/// joined by nested loops only (lease_claim.sql says why), reaching rows
/// through indexes only. That plan is made by a connection's first claim,
/// whatever the table holds then: on an empty table (a coordinator's first
/// claim, before anything was enqueued) a scan of the whole table costs
/// less than an index lookup, and a plan made then would scan every job for
/// every claim of that connection for as long as it lives.
macro_rules! claim_planning {
    () => {
        "SET LOCAL plan_cache_mode = force_generic_plan; \
         SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; \
         SET LOCAL enable_seqscan = off"
    };
}
/// [`claim_planning`], for a transaction already open.
pub const CLAIM_PLANNING: &str = claim_planning!();
/// How the scans of the claim index are planned (the claim statement's and
/// the claim floor's), set local right before them: through the claim
/// index, in its order, never through another index and a sort. Each scan
/// starts at its queue's floor, a row comparison whose selectivity the
/// planner can only guess (a third) for a generic plan; with that guess,
/// and statistics taken while the queue was short, an index on (queue,
/// state) and a sort look cheaper, and under an old snapshot such a plan
/// reads every entry of the queue's history for each claim. Sorts off
/// leave the ordered scan the only plan without one (the statement's own
/// sorts are unavoidable, so unaffected); bitmap scans off likewise; JIT
/// off, since the penalty of the sorts left inflates the cost past JIT's
/// threshold. Not set for the rest of the transaction: the settling of
/// dependents needs its sort.
pub const CLAIM_SCAN_PLANNING: &str =
    "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off; SET LOCAL jit = off";
/// [`CLAIM_SCAN_PLANNING`] undone.
pub const CLAIM_SCAN_PLANNING_RESET: &str = "RESET enable_sort; RESET enable_bitmapscan; RESET jit";
/// [`claim_planning`] and [`CLAIM_SCAN_PLANNING`] undone in a transaction
/// opened with it (for the limited path, which plans as in a transaction
/// of its own).
pub const CLAIM_PLANNING_RESET: &str = "RESET plan_cache_mode; RESET enable_hashjoin; RESET enable_mergejoin; \
     RESET enable_seqscan; RESET enable_sort; RESET enable_bitmapscan; RESET jit";
/// Claim leases of a queue limited per concurrency key.
pub const LEASE_CLAIM_KEYED: Changes = Changes::untallied(include_str!("sql/lease_claim_keyed.sql"));
/// Lock a queue's limits for a claim.
pub const QUEUE_LIMITS_LOCK: &str = include_str!("sql/queue_limits_lock.sql");
/// Running jobs of a queue.
pub const QUEUE_RUNNING_COUNT: &str = include_str!("sql/queue_running_count.sql");
/// Take tokens from a queue's rate-limit bucket.
pub const QUEUE_RATE_TAKE: &str = include_str!("sql/queue_rate_take.sql");
/// Renew leases.
pub const LEASE_HEARTBEAT: &str = include_str!("sql/lease_heartbeat.sql");
/// End leases: complete, fail or release, each item its own action.
pub const LEASE_FINISH: Changes = Changes::new(include_str!("sql/lease_finish.sql"), tally::finished);
/// What became of leases a finish did not match.
pub const LEASE_FINISH_MISSED: &str = include_str!("sql/lease_finish_missed.sql");
/// Reap expired leases.
pub const LEASE_REAP: Changes = Changes::new(include_str!("sql/lease_reap.sql"), tally::reaped);
/// Live jobs per queue and state (indexes over live rows only).
pub const QUEUE_LIVE_COUNTS: &str = include_str!("sql/queue_live_counts.sql");
/// Terminal totals per queue, from the tallies.
pub const QUEUE_TALLIES: &str = include_str!("sql/queue_tallies.sql");
/// Jobs of queues that ended within a recent window.
pub const QUEUE_THROUGHPUT: &str = include_str!("sql/queue_throughput.sql");
/// Row versions of the jobs table, live and dead (its statistics).
pub const JOBS_TABLE_ROWS: &str = include_str!("sql/jobs_table_rows.sql");
/// Fold the tally deltas.
pub const JOB_TALLY_FOLD: &str = include_str!("sql/job_tally_fold.sql");
/// Count the terminal tallies again, if a change made outside the
/// coordinator asked for it.
pub const JOB_TALLY_RECOUNT: &str = include_str!("sql/job_tally_recount.sql");
/// Settings of queues.
pub const QUEUE_SETTINGS_LIST: &str = include_str!("sql/queue_settings_list.sql");
/// Change a queue's settings.
pub const QUEUE_SETTINGS_UPDATE: &str = include_str!("sql/queue_settings_update.sql");
/// Rotate a queue's endpoint secret.
pub const QUEUE_ENDPOINT_ROTATE: &str = include_str!("sql/queue_endpoint_rotate.sql");
/// Record an endpoint's health.
pub const QUEUE_ENDPOINT_HEALTH: &str = include_str!("sql/queue_endpoint_health.sql");
/// Running jobs a queue's endpoint holds.
pub const QUEUE_ENDPOINT_IN_FLIGHT: &str = include_str!("sql/queue_endpoint_in_flight.sql");
/// A page of job ids of a queue, newest first.
pub const JOB_LIST: &str = include_str!("sql/job_list.sql");
/// Which of given jobs a bulk filter matches.
pub const JOB_MATCH: &str = include_str!("sql/job_match.sql");
/// Delete terminal jobs.
pub const JOB_DELETE: Changes = Changes::new(
    concat!(
        include_str!("sql/jobs_locked_by_id.sql"),
        include_str!("sql/job_delete.sql")
    ),
    tally::deleted,
);
/// Delete the attempts of jobs just deleted.
pub const JOB_ATTEMPTS_DELETE: &str = include_str!("sql/job_attempts_delete.sql");
/// One batch of a sweep of attempts whose job is gone.
pub const JOB_ATTEMPTS_SWEEP: &str = include_str!("sql/job_attempts_sweep.sql");
/// Delete expired terminal jobs of a queue and state.
pub const JOB_PRUNE: Changes = Changes::new(include_str!("sql/job_prune.sql"), tally::deleted);
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
    ("job_enqueue", JOB_ENQUEUE.sql()),
    ("job_enqueue_keyed", JOB_ENQUEUE_KEYED.sql()),
    ("job_dependencies_lock", JOB_DEPENDENCIES_LOCK),
    ("job_dependencies_insert", JOB_DEPENDENCIES_INSERT),
    ("job_dependencies_of", JOB_DEPENDENCIES_OF),
    ("job_dependents_of", JOB_DEPENDENTS_OF),
    ("job_dependents_settled", JOB_DEPENDENTS_SETTLED.sql()),
    ("job_dead_letter", JOB_DEAD_LETTER.sql()),
    ("job_get_by_idempotency_key", JOB_GET_BY_IDEMPOTENCY_KEY),
    ("job_get", JOB_GET),
    ("job_cancel", JOB_CANCEL.sql()),
    ("job_retry", JOB_RETRY.sql()),
    ("job_mark_enqueue_failed", JOB_MARK_ENQUEUE_FAILED.sql()),
    ("job_repair_pick", JOB_REPAIR_PICK),
    ("job_repair_requeue", JOB_REPAIR_REQUEUE.sql()),
    ("job_dispatch_pick", JOB_DISPATCH_PICK),
    ("job_dispatch_unmark", JOB_DISPATCH_UNMARK),
    ("attempt_list", ATTEMPT_LIST),
    ("attempt_page", ATTEMPT_PAGE),
    ("lease_claim", LEASE_CLAIM.sql()),
    ("lease_claim_keyed", LEASE_CLAIM_KEYED.sql()),
    ("lease_claim_floor", LEASE_CLAIM_FLOOR),
    ("queue_limits_lock", QUEUE_LIMITS_LOCK),
    ("queue_running_count", QUEUE_RUNNING_COUNT),
    ("queue_rate_take", QUEUE_RATE_TAKE),
    ("lease_heartbeat", LEASE_HEARTBEAT),
    ("lease_finish", LEASE_FINISH.sql()),
    ("lease_finish_missed", LEASE_FINISH_MISSED),
    ("lease_reap", LEASE_REAP.sql()),
    ("queue_live_counts", QUEUE_LIVE_COUNTS),
    ("queue_tallies", QUEUE_TALLIES),
    ("queue_throughput", QUEUE_THROUGHPUT),
    ("jobs_table_rows", JOBS_TABLE_ROWS),
    ("job_tally_fold", JOB_TALLY_FOLD),
    ("job_tally_recount", JOB_TALLY_RECOUNT),
    ("queue_settings_list", QUEUE_SETTINGS_LIST),
    ("queue_settings_update", QUEUE_SETTINGS_UPDATE),
    ("queue_endpoint_rotate", QUEUE_ENDPOINT_ROTATE),
    ("queue_endpoint_health", QUEUE_ENDPOINT_HEALTH),
    ("queue_endpoint_in_flight", QUEUE_ENDPOINT_IN_FLIGHT),
    ("job_list", JOB_LIST),
    ("job_match", JOB_MATCH),
    ("job_delete", JOB_DELETE.sql()),
    ("job_attempts_delete", JOB_ATTEMPTS_DELETE),
    ("job_attempts_sweep", JOB_ATTEMPTS_SWEEP),
    ("job_prune", JOB_PRUNE.sql()),
    ("job_prune_queues", JOB_PRUNE_QUEUES),
    ("prune_lock", PRUNE_LOCK),
    ("queue_held_back", QUEUE_HELD_BACK),
    ("schedule_put", SCHEDULE_PUT),
    ("schedule_list", SCHEDULE_LIST),
    ("schedule_delete", SCHEDULE_DELETE),
    ("schedule_due", SCHEDULE_DUE),
    ("schedule_fired", SCHEDULE_FIRED),
    ("clock_now", CLOCK_NOW),
    ("job_tally_add", tally::JOB_TALLY_ADD),
];

/// The statements of [`ALL`] that are [`Changes`]: only these may set
/// `state` or delete jobs.
pub const CHANGES: &[&str] = &[
    "job_enqueue",
    "job_enqueue_keyed",
    "job_dependents_settled",
    "job_dead_letter",
    "job_cancel",
    "job_retry",
    "job_mark_enqueue_failed",
    "job_repair_requeue",
    "lease_claim",
    "lease_claim_keyed",
    "lease_finish",
    "lease_reap",
    "job_delete",
    "job_prune",
];

#[cfg(test)]
mod tests {
    use super::{ALL, CHANGES};

    /// The statement's text without its `--` comments, lower case, each
    /// run of white space one space.
    fn code(text: &str) -> String {
        text.lines()
            .map(|line| line.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    }

    /// Whether `code` sets `state` of jobs (in the SET list of an update
    /// of jobs, up to its FROM, WHERE or RETURNING), inserts jobs (which
    /// may enter a terminal state at once) or deletes jobs.
    fn changes_states(code: &str) -> bool {
        let sets_state = code.match_indices("update jobs ").any(|(at, _)| {
            let rest = &code[at..];
            let set = rest.find(" set ").map_or("", |s| &rest[s + 5..]);
            let end = [" from ", " where ", " returning "]
                .iter()
                .filter_map(|word| set.find(word))
                .min()
                .unwrap_or(set.len());
            let list = &set[..end];
            list.starts_with("state =") || list.contains(", state =")
        });
        sets_state || code.contains("delete from jobs ") || code.contains("insert into jobs ")
    }

    #[test]
    fn every_statement_that_changes_states_is_tallied() {
        for (name, text) in ALL {
            let code = code(text);
            let declared = CHANGES.contains(name);
            assert_eq!(
                changes_states(&code),
                declared,
                "{name}.sql: a statement that sets `state` or deletes jobs must be declared \
                 `Changes` (with its tally delta) and listed in CHANGES, and only such a one"
            );
            if declared {
                assert!(
                    !code.contains("insert into job_tallies"),
                    "{name}.sql writes tallies itself: the store writes them from its rows"
                );
            }
        }
    }
}
