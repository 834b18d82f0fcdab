-- Count the terminal tallies again if anything asked for it (a change of
-- state or queue made outside the coordinator's statements; migration 8),
-- in a transaction of its own after a fold: the terminal rows of
-- job_tallies are replaced by the count of the jobs in each (queue,
-- terminal state). One
-- snapshot for all of it: a delta committed after it stays, and so does
-- its change to jobs, which the count does not see either, so nothing is
-- lost or counted twice. Only one replica runs it at a time (the prune
-- lock, taken before this statement's snapshot), so no other fold or
-- count can move rows under it.
-- No parameters. Answers one row: how many requests it served (0: nothing
-- was counted).
-- Index: jobs_prune_idx (queue, state, finished_at) WHERE terminal, read
-- whole (index only where the visibility map allows), only when there is
-- a request: its cost follows the terminal jobs kept, so the store gives
-- it a statement timeout of its own.
-- Locking: the request rows and the terminal tally rows it deletes.
WITH requests AS (
    DELETE FROM job_tally_recounts RETURNING 1
), asked AS (
    SELECT count(*) AS n FROM requests
), stale AS (
    DELETE FROM job_tallies
    WHERE tally IN ('done', 'failed', 'cancelled')
      AND (SELECT n FROM asked) > 0
), counted AS (
    INSERT INTO job_tallies (queue, tally, n)
    SELECT queue, state::text, count(*)
    FROM jobs
    WHERE state IN ('done', 'failed', 'cancelled')
      AND (SELECT n FROM asked) > 0
    GROUP BY queue, state
)
SELECT n AS requests FROM asked
