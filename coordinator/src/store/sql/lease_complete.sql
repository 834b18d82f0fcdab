-- Complete running attempts, many at once: one statement guarded per row on
-- (id, state = 'running', run_lease), appending each ended attempt to
-- job_attempts. A completion lands as done even when a cancel was requested.
-- $1 uuid[] ids, $2 bigint[] run leases, $3 jsonb[] results (parallel arrays;
-- one element per request; a repeated (id, run_lease) matches once).
-- Rows that do not match are absent from the answer: stale, or already applied.
-- Index: jobs_pkey.
-- Locking: the rows in id order first (so concurrent batches cannot
-- deadlock), then the guarded UPDATE.
WITH input AS (
    SELECT DISTINCT ON (id, run_lease) *
    FROM unnest($1::uuid[], $2::bigint[], $3::jsonb[]) AS t(id, run_lease, result)
), locked AS (
    SELECT j.id, i.run_lease, i.result
    FROM jobs j
    JOIN input i ON j.id = i.id AND j.state = 'running' AND j.run_lease = i.run_lease
    ORDER BY j.id
    FOR UPDATE OF j
), finished AS (
    UPDATE jobs j SET
        state = 'done', result = l.result, finished_at = now(),
        lease_expires_at = NULL, updated_at = now()
    FROM locked l
    WHERE j.id = l.id AND j.state = 'running' AND j.run_lease = l.run_lease
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(), 'completed', state FROM finished
)
SELECT * FROM finished
