-- What became of leases a finish did not match, read after that finish
-- committed: how each lease's attempt ended, if it has (tells a repeated
-- finish, answered 200, from a stale one, 409), and where its job is now.
-- $1 uuid[] job ids, $2 bigint[] run leases (parallel arrays).
-- A row per item whose job exists; outcome and worker_id are NULL while the
-- lease has no ended attempt.
-- Index: jobs_pkey, job_attempts_pkey. Locking: none.
SELECT k.job_id AS id, k.run_lease, j.state, j.queue, j.created_at, j.finished_at,
       a.outcome, a.worker_id
FROM unnest($1::uuid[], $2::bigint[]) AS k(job_id, run_lease)
JOIN jobs j ON j.id = k.job_id
LEFT JOIN job_attempts a ON a.job_id = k.job_id AND a.run_lease = k.run_lease
