-- Fail a running attempt: one guarded statement on (id, state = 'running',
-- run_lease). With a cancel requested the job becomes cancelled; with budget
-- left and retryable it is queued again after the delay (the worker's
-- retry_after_ms, or exponential backoff with full jitter); otherwise failed.
-- The attempt is appended to job_attempts in the same statement.
-- $1 uuid id, $2 bigint run_lease, $3 text error, $4 bool retryable,
-- $5 bigint retry_after_ms (NULL: backoff), $6 bigint backoff base ms,
-- $7 bigint backoff cap ms.
-- Index: jobs_pkey. Locking: the row (FOR UPDATE, then the guarded UPDATE).
WITH target AS (
    SELECT id,
           CASE WHEN cancel_requested_at IS NOT NULL THEN 'cancelled'::job_state
                WHEN $4::boolean AND attempt < max_attempts THEN 'queued'::job_state
                ELSE 'failed'::job_state END AS next_state,
           coalesce($5::bigint,
                    floor(random() * least($7::bigint::float8,
                                           $6::bigint * power(2::float8, least(attempt - 1, 40))))::bigint
           ) AS delay_ms
    FROM jobs
    WHERE id = $1 AND state = 'running' AND run_lease = $2
    FOR UPDATE
), finished AS (
    UPDATE jobs j SET
        state = t.next_state,
        error = $3,
        lease_expires_at = NULL,
        run_at = CASE WHEN t.next_state = 'queued'
                      THEN now() + t.delay_ms * interval '1 millisecond' ELSE j.run_at END,
        finished_at = CASE WHEN t.next_state = 'queued' THEN NULL ELSE now() END,
        updated_at = now()
    FROM target t
    WHERE j.id = t.id AND j.state = 'running' AND j.run_lease = $2
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempts (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
    SELECT id, run_lease, owned_by, claimed_at, now(),
           CASE WHEN state = 'cancelled' THEN 'cancelled'::attempt_outcome ELSE 'failed' END,
           $3, state
    FROM finished
)
SELECT * FROM finished
