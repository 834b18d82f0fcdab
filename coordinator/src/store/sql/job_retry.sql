-- Admin retry: a failed or cancelled job back to queued with a fresh attempt
-- budget. run_lease is untouched: it only grows, at the next claim.
-- $1 uuid id.
-- Index: jobs_pkey. Locking: the row, for the statement.
UPDATE jobs SET
    state = 'queued', attempt = 0, run_at = now(), finished_at = NULL,
    cancel_requested_at = NULL, result = NULL, updated_at = now()
WHERE id = $1 AND state IN ('failed', 'cancelled')
RETURNING *
