-- Release a running attempt: one guarded statement on (id, state = 'running',
-- run_lease). The job is claimable again at once and the attempt's charge is
-- given back; with a cancel requested it becomes cancelled instead. The
-- worker's checkpoint (NULL keeps the saved one) is what the next attempt gets.
-- $1 uuid id, $2 bigint run_lease, $3 jsonb progress.
-- Index: jobs_pkey. Locking: the row, for the statement.
WITH finished AS (
    UPDATE jobs SET
        state = CASE WHEN cancel_requested_at IS NOT NULL
                     THEN 'cancelled'::job_state ELSE 'queued'::job_state END,
        attempt = CASE WHEN cancel_requested_at IS NOT NULL THEN attempt ELSE attempt - 1 END,
        progress = coalesce($3::jsonb, progress),
        run_at = now(),
        lease_expires_at = NULL,
        finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
        updated_at = now()
    WHERE id = $1 AND state = 'running' AND run_lease = $2
    RETURNING *
), recorded AS (
    INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(),
           CASE WHEN state = 'cancelled' THEN 'cancelled'::attempt_outcome ELSE 'released' END,
           state
    FROM finished
)
SELECT * FROM finished
