-- The ended attempts of jobs, oldest first; the running one lives on the job row.
-- $1 uuid[] job ids.
-- Index: job_attempts_pkey (job_id, run_lease). Locking: none.
SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error
FROM job_attempts
WHERE job_id = ANY($1::uuid[])
ORDER BY job_id, run_lease
