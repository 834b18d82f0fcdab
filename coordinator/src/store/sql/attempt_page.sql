-- One page of a job's ended attempts: those before a run lease, the latest
-- $3 of them, oldest first (GET /v1/jobs/{id}/attempts).
-- $1 uuid job id; $2 bigint run lease to page before (exclusive); $3
-- bigint most attempts (the caller asks one more than it answers).
-- Index: job_attempt_log_pkey (job_id, run_lease), walked backwards from
-- $2; jobs_pkey for the attempt recorded on the job row. Locking: none.
SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, retry_at, retry_reason
FROM (
    SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, retry_at, retry_reason
    FROM job_attempts
    WHERE job_id = $1 AND run_lease < $2
    ORDER BY run_lease DESC
    LIMIT $3
) AS page
ORDER BY run_lease
