-- The latest ended attempts of jobs, at most $2 per job, oldest first, from
-- the job_attempts view: the rows of job_attempt_log, and the attempt that
-- ended a job where it is recorded on the job row (final_outcome). The
-- running attempt lives on the job row too. A job's chronology has no
-- bound (a claim/release loop grows it), so no answer carries all of it:
-- the caller asks for one more than it answers, to know whether earlier
-- attempts exist (GET /v1/jobs/{id}/attempts pages them).
-- $1 uuid[] job ids; $2 bigint most attempts per job.
-- Index: each lateral scan walks job_attempt_log_pkey (job_id, run_lease)
-- backwards and reads the job row by jobs_pkey. Locking: none.
SELECT a.job_id, a.run_lease, a.worker_id, a.claimed_at, a.finished_at, a.outcome, a.error,
       a.retry_at, a.retry_reason
FROM unnest($1::uuid[]) AS j(id)
CROSS JOIN LATERAL (
    SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, retry_at, retry_reason
    FROM job_attempts
    WHERE job_id = j.id
    ORDER BY run_lease DESC
    LIMIT $2
) AS a
ORDER BY a.job_id, a.run_lease
