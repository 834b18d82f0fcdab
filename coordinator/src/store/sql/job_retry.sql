-- Admin retry: failed or cancelled jobs back to queued with a fresh attempt
-- budget. run_lease is untouched: it only grows, at the next claim. Jobs in
-- other states are untouched (absent from the answer).
-- $1 uuid[] ids, $2 text[] states the job must still be in (a bulk action's
-- filter, re-checked on the locked row; NULL: any).
-- Index: jobs_pkey.
-- Locking: the rows in id order (the order every batch statement locks in).
WITH locked AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE id = ANY($1::uuid[])
    ORDER BY id
    FOR UPDATE
)
UPDATE jobs j SET
    state = 'queued', attempt = 0, run_at = now(), finished_at = NULL,
    cancel_requested_at = NULL, result = NULL, updated_at = now()
FROM locked l
WHERE j.id = l.id AND j.state IN ('failed', 'cancelled')
  AND ($2::text[] IS NULL OR j.state::text = ANY($2::text[]))
RETURNING j.id, j.queue, j.state, j.created_at, j.finished_at
