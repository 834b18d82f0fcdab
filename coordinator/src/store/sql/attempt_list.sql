-- The ended attempts of jobs, oldest first: the rows of job_attempt_log, and
-- the attempt that ended a job where it is recorded on the job row
-- (final_outcome). The running attempt lives on the job row too.
-- $1 uuid[] job ids.
-- Index: job_attempt_log_pkey (job_id, run_lease), jobs_pkey. Locking: none.
SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error
FROM job_attempt_log
WHERE job_id = ANY($1::uuid[])
UNION ALL
SELECT id, run_lease, owned_by, claimed_at, finished_at, final_outcome,
       CASE WHEN final_outcome = 'failed' THEN error END
FROM jobs
WHERE id = ANY($1::uuid[]) AND final_outcome IS NOT NULL
ORDER BY 1, 2
