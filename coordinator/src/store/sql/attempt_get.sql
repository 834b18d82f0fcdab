-- How attempts ended, if they have: tells a repeated finish (200) from a stale
-- one (409).
-- $1 uuid[] job ids, $2 bigint[] run leases (parallel arrays).
-- Index: job_attempts_pkey. Locking: none.
SELECT a.job_id, a.run_lease, a.outcome, a.worker_id
FROM unnest($1::uuid[], $2::bigint[]) AS k(job_id, run_lease)
JOIN job_attempts a ON a.job_id = k.job_id AND a.run_lease = k.run_lease
