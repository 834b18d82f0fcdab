-- Fold the tally deltas into one row per (queue, tally); totals of zero go.
-- Deltas appended while this runs are not in its snapshot and stay for the
-- next fold, so no count is lost or doubled (two folds at once each delete
-- only rows they saw; a row the other deleted first is skipped).
-- No parameters.
-- Index: none (the table is small). Locking: the deleted rows.
WITH gone AS (
    DELETE FROM job_tallies RETURNING queue, tally, n
)
INSERT INTO job_tallies (queue, tally, n)
SELECT queue, tally, sum(n)::bigint
FROM gone
GROUP BY queue, tally
HAVING sum(n) <> 0
