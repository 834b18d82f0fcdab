-- How one attempt ended, if it has: tells a repeated finish (200) from a stale one (409).
-- $1 uuid job id, $2 bigint run_lease.
-- Index: job_attempts_pkey. Locking: none.
SELECT outcome, worker_id FROM job_attempts WHERE job_id = $1 AND run_lease = $2
