-- Finish and claim in one statement: the steps of lease_finish.sql, then
-- the claim's (lease_claim.sql and lease_claim_update.sql, as the CTE
-- claimed, their parameters numbered from $11), then this answer. One
-- statement instead of two saves what PostgreSQL spends on every statement
-- (its executor's start and end, its triggers' and constraints' set-up),
-- a large part of what a small batch costs.
-- Used only when every item completes its job: both parts read the same
-- snapshot, so a job an item released (or queued again after a fail) would
-- not be claimable in the same statement; such batches run the two
-- statements one after the other, in one transaction.
-- $1..$10 as in lease_finish.sql; $11..$17 as $1..$7 in lease_claim.sql.
-- Answers the claim's rows (slot set; the job's columns) and the finish's
-- (slot NULL; action, traced and the job columns the finish answers: id,
-- run_lease, queue, state, created_at, finished_at).
-- Locking: the finish's rows first, then the claim's, as when the two run
-- as separate statements: the answer reads `finished` to its end before
-- it reads anything of `claimed` (the branches of a UNION ALL run one after
-- the other, in order), and reading a data-modifying CTE is what runs it.
-- So the finish's update locks its rows (in id order, waiting where a
-- heartbeat holds one) while this statement holds no claimed row yet, and
-- the claim's scan, which skips locked rows and never waits, comes after:
-- no cycle of waits with a heartbeat or another finish can form. The two
-- parts touch different rows (running ones against claimable ones).
SELECT id, queue, state, NULL::jsonb AS payload, NULL::integer AS priority, NULL::integer AS attempt,
       NULL::integer AS max_attempts, run_lease, NULL::timestamptz AS run_at, created_at,
       NULL::timestamptz AS updated_at, finished_at, NULL::bigint AS timeout_ms,
       NULL::text AS idempotency_key, NULL::text AS concurrency_key, NULL::jsonb AS progress,
       NULL::jsonb AS result, NULL::text AS error, NULL::timestamptz AS cancel_requested_at,
       NULL::text AS owned_by, NULL::timestamptz AS claimed_at, NULL::text AS traceparent,
       NULL::bigint AS slot, action, traced
FROM finished
UNION ALL
SELECT id, queue, state, payload, priority, attempt, max_attempts, run_lease, run_at, created_at,
       updated_at, finished_at, timeout_ms, idempotency_key, concurrency_key, progress, result, error,
       cancel_requested_at, owned_by, claimed_at, traceparent, slot, NULL, NULL
FROM claimed
