-- Cancel a job: a claimable job becomes cancelled at once; a running job keeps
-- running with cancel_requested_at set until its worker acknowledges (fail or
-- release) or the reaper finds its lease expired. Terminal jobs are untouched
-- (no row: the caller answers 404 or 409).
-- $1 uuid id.
-- Index: jobs_pkey. Locking: the row, for the statement.
UPDATE jobs SET
    state = CASE WHEN state = 'running' THEN state ELSE 'cancelled'::job_state END,
    cancel_requested_at = CASE WHEN state = 'running'
                               THEN coalesce(cancel_requested_at, now()) END,
    finished_at = CASE WHEN state = 'running' THEN NULL ELSE now() END,
    updated_at = now()
WHERE id = $1 AND state IN ('queued', 'enqueue_failed', 'running')
RETURNING *
