-- Admin retry: failed or cancelled jobs back to queued with a fresh attempt
-- budget and a fresh retry window (it counts from the next first attempt). run_lease is untouched: it only grows, at the next claim. Jobs in
-- other states are untouched (absent from the answer). A failed job whose
-- final attempt is recorded on its row (final_outcome) has that attempt
-- written to job_attempt_log first, in this statement, as the finish would
-- have written it: the chronology is the same before and after.
-- $1 uuid[] ids, $2 text[] states the job must still be in (a bulk action's
-- filter, re-checked on the locked row; NULL: any).
-- Tallies: the store takes the rows answered off the tally of their
-- state_before, the terminal state they left (tally::retried).
-- Index: jobs_pkey.
-- Locking: the rows in id order (the order every batch statement locks in).
WITH locked AS MATERIALIZED (
    -- The values before this statement's update: the final attempt's.
    SELECT id, run_lease, owned_by, claimed_at, finished_at, final_outcome, error, state, retry_reason
    FROM jobs
    WHERE id = ANY($1::uuid[])
    ORDER BY id
    FOR UPDATE
), retried AS (
    UPDATE jobs j SET
        state = 'queued', attempt = 0, run_at = now(), finished_at = NULL,
        cancel_requested_at = NULL, result = NULL, final_outcome = NULL, updated_at = now(),
        first_claimed_at = NULL, retry_reason = NULL
    FROM locked l
    WHERE j.id = l.id AND j.state IN ('failed', 'cancelled')
      AND ($2::text[] IS NULL OR j.state::text = ANY($2::text[]))
    RETURNING j.id, j.queue, j.state, j.created_at, j.finished_at
), written_out AS (
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after,
                                 retry_reason)
    SELECT l.id, l.run_lease, l.owned_by, l.claimed_at, l.finished_at, l.final_outcome,
           CASE WHEN l.final_outcome = 'failed' THEN l.error END, l.state,
           CASE WHEN l.final_outcome = 'failed' THEN l.retry_reason END
    FROM locked l
    JOIN retried r ON r.id = l.id
    WHERE l.final_outcome IS NOT NULL
)
SELECT r.id, r.queue, r.state, r.created_at, r.finished_at, l.state AS state_before
FROM retried r
JOIN locked l ON l.id = r.id
