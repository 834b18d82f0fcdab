-- Reap up to $1 expired leases: with a cancel requested the job becomes
-- cancelled; with budget left it is queued again, claimable at once (the
-- expiry was the wait); otherwise failed. The expired attempt is charged and
-- appended to job_attempt_log as lease_expired.
-- Each write is guarded on the run_lease the reaper read and on the expiry
-- itself, so a lease renewed a moment ago is never reaped.
-- Tallies: the store counts each row answered (tally::reaped): the job's
-- terminal state, and the attempt written: a lease expiry, and a retry
-- where the job is queued again.
-- $1 bigint limit, $2 bigint default timeout ms (to tell a timeout from a lapse).
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
                     WHEN j.attempt < j.max_attempts THEN 'queued'::job_state
                     ELSE 'failed'::job_state END,
        error = CASE WHEN j.lease_expires_at >= j.claimed_at + coalesce(j.timeout_ms, $2::bigint) * interval '1 millisecond'
                     THEN 'attempt exceeded its timeout'
                     ELSE 'lease expired: no heartbeat within the lease TTL' END,
        run_at = now(),
        lease_expires_at = NULL,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempt >= j.max_attempts
                           THEN now() END,
        updated_at = now()
    FROM expired e
    WHERE j.id = e.id AND j.state = 'running' AND j.run_lease = e.run_lease
      AND j.lease_expires_at <= now()
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(), 'lease_expired', error, state FROM reaped
)
SELECT * FROM reaped
