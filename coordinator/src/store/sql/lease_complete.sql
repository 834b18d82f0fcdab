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
), locked AS MATERIALIZED (
    -- Locked by id alone, in id order: jobs_pkey whatever the statistics
    -- say (a state predicate here would let the planner pick a partial index
    -- and scan every running job). The guard is then checked on the locked
    -- row, which nothing else can change before this transaction ends.
    SELECT j.id, j.state, j.run_lease AS held_lease, i.run_lease, i.result
    FROM input i
    JOIN jobs j ON j.id = i.id
    ORDER BY j.id
    FOR UPDATE OF j
), finished AS (
    UPDATE jobs j SET
        state = 'done', result = l.result, finished_at = now(),
        lease_expires_at = NULL, updated_at = now()
    FROM locked l
    WHERE j.id = l.id AND l.state = 'running' AND l.held_lease = l.run_lease
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(), 'completed', state FROM finished
)
SELECT * FROM finished
