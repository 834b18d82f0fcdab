-- What became of leases a finish did not match, read after that finish
-- committed: how each lease's attempt ended, if it has (tells a repeated
-- finish, answered 200, from a stale one, 409), and where its job is now.
-- An attempt that ended its job is recorded on the job row (final_outcome,
-- owned_by) until the job is retried; every other one in job_attempt_log.
-- $1 uuid[] job ids, $2 bigint[] run leases (parallel arrays).
-- A row per item whose job exists; outcome and worker_id are NULL while the
-- lease has no ended attempt.
-- Index: jobs_pkey, job_attempt_log_pkey. The final attempt is read from the
-- joined job row here, not through the job_attempts view: joined to a set
-- of leases, the view is planned as a scan of both of its tables.
-- Locking: none.
SELECT k.job_id AS id, k.run_lease, j.state, j.queue, j.created_at, j.finished_at,
       j.traceparent IS NOT NULL AS traced,
       coalesce(a.outcome, f.outcome) AS outcome, coalesce(a.worker_id, f.worker_id) AS worker_id
FROM unnest($1::uuid[], $2::bigint[]) AS k(job_id, run_lease)
JOIN jobs j ON j.id = k.job_id
LEFT JOIN job_attempt_log a ON a.job_id = k.job_id AND a.run_lease = k.run_lease
LEFT JOIN LATERAL (
    SELECT j.final_outcome AS outcome, j.owned_by AS worker_id
    WHERE j.final_outcome IS NOT NULL AND j.run_lease = k.run_lease
) f ON true
