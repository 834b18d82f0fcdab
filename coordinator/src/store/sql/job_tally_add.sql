-- Append the tally deltas of one transaction, one row per (queue, tally),
-- written by the store (store::tally::Tallied) with the transaction's
-- COMMIT: the statements that change states answer what they changed, and
-- the store sums it. The prune loop folds the rows (job_tally_fold.sql).
-- $1 text[] queues, $2 text[] tallies ('done', 'failed', 'cancelled',
-- 'lease_expiries', 'retries'), $3 bigint[] counts (negative for jobs that
-- left a terminal state), parallel arrays.
-- Index: none (append only). Locking: none.
INSERT INTO job_tallies (queue, tally, n)
SELECT queue, tally, n
FROM unnest($1::text[], $2::text[], $3::bigint[]) AS t(queue, tally, n)
