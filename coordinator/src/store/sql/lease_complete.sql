-- Complete a running attempt: one guarded statement on (id, state = 'running',
-- run_lease) that also appends the attempt to job_attempts. A completion lands
-- as done even when a cancel was requested.
-- $1 uuid id, $2 bigint run_lease, $3 jsonb result.
-- No row: the lease is stale (or this completion was already applied).
-- Index: jobs_pkey. Locking: the row, for the statement.
WITH finished AS (
    UPDATE jobs SET
        state = 'done', result = $3::jsonb, finished_at = now(),
        lease_expires_at = NULL, updated_at = now()
    WHERE id = $1 AND state = 'running' AND run_lease = $2
    RETURNING *
), recorded AS (
    INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(), 'completed', state FROM finished
)
SELECT * FROM finished
