-- Terminal totals per queue: done, failed, cancelled (jobs in that state
-- now), lease_expiries and retries (attempts since the tallies began). The
-- coordinator's statements append deltas (and the attempt log's trigger,
-- for attempts written elsewhere); job_tally_fold.sql folds them, and
-- job_tally_recount.sql counts the terminal ones again when asked.
-- No parameters.
-- Index: none; job_tallies holds one row per (queue, tally) plus the deltas
-- written since the last fold (about one per statement that finished jobs).
-- Locking: none.
SELECT queue, tally, sum(n)::bigint AS n
FROM job_tallies
GROUP BY queue, tally
