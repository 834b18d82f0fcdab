-- Reap up to $1 expired leases: with a cancel requested the job becomes
-- cancelled; with budget left and its retry window still open it is queued
-- again, claimable at once (the expiry was the wait: no backoff); otherwise
-- failed, and, on a queue with a dead-letter queue, answered with it and
-- the id its follow-up takes: the store enqueues the follow-up with the
-- next statement of this transaction (job_dead_letter.sql, as after a
-- finish). The expired attempt is charged
-- and appended to job_attempt_log as lease_expired, with when the retry
-- may start and why (or why there is none).
-- Each write is guarded on the run_lease the reaper read and on the expiry
-- itself, so a lease renewed a moment ago is never reaped.
-- Tallies: the store counts each row answered (tally::reaped): the job's
-- terminal state, and the attempt written: a lease expiry, and a retry
-- where the job is queued again.
-- $1 bigint limit, $2 bigint default timeout ms (to tell a timeout from a
-- lapse).
-- Answers the reaped jobs' rows, a job failed for good with its queue's
-- dead-letter queue and its follow-up's id (NULL for the others).
-- Index: jobs_running_idx (queue, id) WHERE running: a pass over the running
-- jobs (their rows are read for the expiry, which no index keys: a
-- heartbeat then changes no indexed column). Its cost follows the jobs
-- running, never the history; the pass stops at $1 expired ones.
-- Locking: FOR UPDATE SKIP LOCKED: reapers on several coordinators split the
-- expired rows between them and never reap one lease twice.
WITH expired AS (
    SELECT id, run_lease
    FROM jobs
    WHERE state = 'running' AND lease_expires_at <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE jobs j SET
        state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::job_state
                     WHEN j.attempt < j.max_attempts
                          AND (j.retry_window_ms IS NULL
                               OR now() <= coalesce(j.first_claimed_at, j.claimed_at)
                                           + j.retry_window_ms * interval '1 millisecond')
                     THEN 'queued'::job_state
                     ELSE 'failed'::job_state END,
        error = CASE WHEN j.lease_expires_at >= j.claimed_at + coalesce(j.timeout_ms, $2::bigint) * interval '1 millisecond'
                     THEN 'attempt exceeded its timeout'
                     ELSE 'lease expired: no heartbeat within the lease TTL' END,
        run_at = now(),
        lease_expires_at = NULL,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempt >= j.max_attempts
                                OR now() > coalesce(j.first_claimed_at, j.claimed_at)
                                           + j.retry_window_ms * interval '1 millisecond'
                           THEN now() END,
        retry_reason = CASE WHEN j.cancel_requested_at IS NOT NULL THEN NULL
                            WHEN j.attempt >= j.max_attempts THEN
                                format('attempts_exhausted: %s of %s attempts used', j.attempt, j.max_attempts)
                            WHEN now() > coalesce(j.first_claimed_at, j.claimed_at)
                                         + j.retry_window_ms * interval '1 millisecond' THEN
                                format('retry_window_ended: a retry now would start more than %s ms after the first attempt started',
                                       j.retry_window_ms)
                            ELSE 'lease_expired: claimable again at once' END,
        first_claimed_at = coalesce(j.first_claimed_at, j.claimed_at),
        updated_at = now()
    FROM expired e
    WHERE j.id = e.id AND j.state = 'running' AND j.run_lease = e.run_lease
      AND j.lease_expires_at <= now()
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after,
                                 retry_at, retry_reason)
    SELECT id, run_lease, owned_by, claimed_at, now(), 'lease_expired', error, state,
           CASE WHEN state = 'queued' THEN run_at END, retry_reason
    FROM reaped
)
SELECT r.*, s.dead_letter_queue,
       CASE WHEN s.dead_letter_queue IS NOT NULL THEN job_id_v7() END AS dead_letter_id
FROM reaped r
LEFT JOIN queue_settings s ON s.queue = r.queue AND r.state = 'failed'
