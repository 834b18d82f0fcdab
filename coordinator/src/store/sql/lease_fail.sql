-- Fail running attempts, many at once: one statement guarded per row on
-- (id, state = 'running', run_lease). With a cancel requested the job becomes
-- cancelled; with budget left and retryable it is queued again after the
-- delay (the worker's retry_after_ms, or exponential backoff with full
-- jitter); otherwise failed. Each ended attempt is appended to job_attempts.
-- $1 uuid[] ids, $2 bigint[] run leases, $3 text[] errors, $4 bool[] retryable,
-- $5 bigint[] retry_after_ms (NULL: backoff), $6 bigint backoff base ms,
-- $7 bigint backoff cap ms.
-- Rows that do not match are absent from the answer: stale, or already applied.
-- Index: jobs_pkey.
-- Locking: the rows in id order first (no deadlock between batches), then the
-- guarded UPDATE.
WITH input AS (
    SELECT DISTINCT ON (id, run_lease) *
    FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::boolean[], $5::bigint[])
         AS t(id, run_lease, error, retryable, retry_after_ms)
), target AS MATERIALIZED (
    -- Locked by id alone, in id order: jobs_pkey whatever the statistics
    -- say (a state predicate here would let the planner pick a partial index
    -- and scan every running job). The guard is then checked on the locked
    -- row, which nothing else can change before this transaction ends.
    SELECT j.id, j.state, j.run_lease AS held_lease, i.run_lease, i.error,
           CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::job_state
                WHEN i.retryable AND j.attempt < j.max_attempts THEN 'queued'::job_state
                ELSE 'failed'::job_state END AS next_state,
           coalesce(i.retry_after_ms,
                    floor(random() * least($7::bigint::float8,
                                           $6::bigint * power(2::float8, least(j.attempt - 1, 40))))::bigint
           ) AS delay_ms
    FROM input i
    JOIN jobs j ON j.id = i.id
    ORDER BY j.id
    FOR UPDATE OF j
), finished AS (
    UPDATE jobs j SET
        state = t.next_state,
        error = t.error,
        lease_expires_at = NULL,
        run_at = CASE WHEN t.next_state = 'queued'
                      THEN now() + t.delay_ms * interval '1 millisecond' ELSE j.run_at END,
        finished_at = CASE WHEN t.next_state = 'queued' THEN NULL ELSE now() END,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id AND t.state = 'running' AND t.held_lease = t.run_lease
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(),
           CASE WHEN state = 'cancelled' THEN 'cancelled'::attempt_outcome ELSE 'failed' END,
           error, state
    FROM finished
)
SELECT * FROM finished
