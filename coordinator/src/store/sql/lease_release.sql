-- Release running attempts, many at once: one statement guarded per row on
-- (id, state = 'running', run_lease). Each job is claimable again at once and
-- the attempt's charge is given back; with a cancel requested it becomes
-- cancelled instead. The worker's checkpoint (NULL keeps the saved one) is what
-- the next attempt gets.
-- $1 uuid[] ids, $2 bigint[] run leases, $3 jsonb[] progress.
-- Rows that do not match are absent from the answer: stale, or already applied.
-- Index: jobs_pkey.
-- Locking: the rows in id order first (no deadlock between batches), then the
-- guarded UPDATE.
WITH input AS (
    SELECT DISTINCT ON (id, run_lease) *
    FROM unnest($1::uuid[], $2::bigint[], $3::jsonb[]) AS t(id, run_lease, progress)
), locked AS MATERIALIZED (
    -- Locked by id alone, in id order: jobs_pkey whatever the statistics
    -- say (a state predicate here would let the planner pick a partial index
    -- and scan every running job). The guard is then checked on the locked
    -- row, which nothing else can change before this transaction ends.
    SELECT j.id, j.state, j.run_lease AS held_lease, i.run_lease, i.progress
    FROM input i
    JOIN jobs j ON j.id = i.id
    ORDER BY j.id
    FOR UPDATE OF j
), finished AS (
    UPDATE jobs j SET
        state = CASE WHEN j.cancel_requested_at IS NOT NULL
                     THEN 'cancelled'::job_state ELSE 'queued'::job_state END,
        attempt = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.attempt ELSE j.attempt - 1 END,
        progress = coalesce(l.progress, j.progress),
        run_at = now(),
        lease_expires_at = NULL,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN now() END,
        updated_at = now()
    FROM locked l
    WHERE j.id = l.id AND l.state = 'running' AND l.held_lease = l.run_lease
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(),
           CASE WHEN state = 'cancelled' THEN 'cancelled'::attempt_outcome ELSE 'released' END,
           state
    FROM finished
)
SELECT * FROM finished
