-- One batch of the sweep of the attempt log: if a sweep was asked for
-- (a delete of jobs made outside the coordinator's statements, or a
-- TRUNCATE, appended a row to job_attempt_sweeps; migration 9), delete up
-- to $1 attempts whose job is gone. The batch that deletes fewer than $1
-- is the last: it also deletes the requests it sees, in the same
-- statement, so a request committed after its snapshot (for a delete
-- whose attempts it may not see) stays for the next sweep. The store runs
-- batches, each its own transaction under the recount lock, until the
-- last.
-- Why the snapshot can tell: an attempt is written only for an existing
-- job row its statement holds locked, so an attempt this snapshot sees
-- whose job it does not see belongs to a deleted job.
-- $1 int batch size. Answers one row: requests (the requests waiting: 0
-- means nothing was asked and nothing was read), swept (attempts deleted),
-- done (whether this was the last batch).
-- Index: reads job_attempt_log in physical order and probes jobs_pkey per
-- attempt (or the planner's choice of a pass over jobs), only when asked;
-- a batch stops after $1 orphans. Its cost follows the attempt log, so the
-- store gives it a statement timeout of its own.
-- Locking: the attempts and the requests it deletes.
WITH asked AS (
    SELECT count(*) AS n FROM job_attempt_sweeps
), swept AS (
    DELETE FROM job_attempt_log
    WHERE ctid = ANY (ARRAY(
        SELECT a.ctid
        FROM job_attempt_log a
        WHERE (SELECT n FROM asked) > 0
          AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.id = a.job_id)
        LIMIT $1))
    RETURNING 1
), counted AS (
    SELECT count(*) AS n FROM swept
), served AS (
    DELETE FROM job_attempt_sweeps
    WHERE (SELECT n FROM counted) < $1
    RETURNING 1
)
SELECT (SELECT n FROM asked) AS requests,
       (SELECT n FROM counted) AS swept,
       (SELECT n FROM counted) < $1 AS done
