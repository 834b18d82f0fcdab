-- The ended attempts of jobs, oldest first, from the job_attempts view: the
-- rows of job_attempt_log, and the attempt that ended a job where it is
-- recorded on the job row (final_outcome). The running attempt lives on the
-- job row too.
-- $1 uuid[] job ids.
-- Index: the filter reaches both branches of the view: job_attempt_log_pkey
-- (job_id, run_lease) and jobs_pkey. Locking: none.
SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error
FROM job_attempts
WHERE job_id = ANY($1::uuid[])
ORDER BY job_id, run_lease
