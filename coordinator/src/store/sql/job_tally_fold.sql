-- Fold the tally deltas into one row per (queue, tally); totals of zero go.
-- Deltas appended while this runs are not in its snapshot and stay for the
-- next fold, so no count is lost or doubled (two folds at once each delete
-- only rows they saw; a row the other deleted first is skipped).
-- No parameters. Answers one row: whether a recount of the tallies or a
-- sweep of the attempt log was asked for (job_tally_recounts or
-- job_attempt_sweeps holds a request), so the prune loop starts them only
-- then.
-- Index: none (the tables are small). Locking: the deleted rows.
WITH gone AS (
    DELETE FROM job_tallies RETURNING queue, tally, n
), folded AS (
    INSERT INTO job_tallies (queue, tally, n)
    SELECT queue, tally, sum(n)::bigint
    FROM gone
    GROUP BY queue, tally
    HAVING sum(n) <> 0
)
SELECT EXISTS (SELECT 1 FROM job_tally_recounts)
       OR EXISTS (SELECT 1 FROM job_attempt_sweeps) AS recount_asked
