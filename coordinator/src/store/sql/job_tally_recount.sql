-- Count the terminal tallies again if anything asked for it (a change of
-- state or queue, or a delete, made outside the coordinator's statements;
-- migration 8): for each (queue, terminal state), the jobs in it now minus
-- what job_tallies says, appended as one more delta row where they differ.
-- It only appends, so it neither waits on nor disturbs a fold, a prune or
-- a coordinator's statement running beside it. One snapshot for all of
-- it: a delta committed after the snapshot is not in the sum, and the job
-- change it stands for is not in the count either; a fold keeps every sum
-- as it was, committed or not. So nothing is lost or counted twice. Two
-- recounts never run at once (the store takes the recount lock first, in
-- an earlier statement); the next one sees this one's correction.
-- No parameters. Answers one row: how many requests it served (0: nothing
-- was counted).
-- Index: jobs_prune_idx (queue, state, finished_at) WHERE terminal, read
-- whole (index only where the visibility map allows), only when there is
-- a request: its cost follows the terminal jobs kept, so the store gives
-- it a statement timeout of its own.
-- Locking: the request rows it deletes.
WITH requests AS (
    DELETE FROM job_tally_recounts RETURNING 1
), asked AS (
    SELECT count(*) AS n FROM requests
), counted AS (
    SELECT queue, state::text AS tally, count(*) AS n
    FROM jobs
    WHERE state IN ('done', 'failed', 'cancelled')
      AND (SELECT n FROM asked) > 0
    GROUP BY queue, state
), tallied AS (
    SELECT queue, tally, sum(n)::bigint AS n
    FROM job_tallies
    WHERE tally IN ('done', 'failed', 'cancelled')
      AND (SELECT n FROM asked) > 0
    GROUP BY queue, tally
), corrected AS (
    INSERT INTO job_tallies (queue, tally, n)
    SELECT coalesce(c.queue, t.queue), coalesce(c.tally, t.tally),
           coalesce(c.n, 0) - coalesce(t.n, 0)
    FROM counted c
    FULL JOIN tallied t ON t.queue = c.queue AND t.tally = c.tally
    WHERE coalesce(c.n, 0) <> coalesce(t.n, 0)
)
SELECT n AS requests FROM asked
