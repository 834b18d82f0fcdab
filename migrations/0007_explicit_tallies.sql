-- runlease schema, version 7: the terminal tallies are written by the
-- statements that move jobs in and out of done, failed and cancelled,
-- instead of by a trigger on every update of jobs.
--
-- jobs_tallies_update was a statement-level trigger with transition
-- tables: PostgreSQL copied the old and the new version of every row that
-- any UPDATE of jobs touched (claims and heartbeats included, which never
-- change a tally) and ran the function after each statement. On the drain
-- benchmark it was an eighth of PostgreSQL's CPU per job. PostgreSQL
-- refuses a column list on a trigger with transition tables, so it could
-- not be limited to changes of state.
--
-- Now the coordinator's own statements that can change a tally (the
-- finish, the reaper, cancel, retry) add their deltas to job_tallies
-- themselves, one row per (queue, tally) per statement, as the trigger
-- did, each in a transaction that sets runlease.tallies = 'explicit'
-- (SET LOCAL: it holds behind a pooler in transaction mode too). Every
-- other update (a coordinator of the previous version during a rolling
-- upgrade, an operator's UPDATE by hand, any statement outside such a
-- transaction) is still counted, by the row-level trigger below: it fires
-- only for rows whose state enters or leaves a terminal state, outside
-- transactions with that setting, and adds one delta row per such row
-- (job_tally_fold.sql folds them later). Deletes keep their
-- statement-level trigger (jobs_tallies_delete).
--
-- Locking: DROP TRIGGER takes jobs' ACCESS EXCLUSIVE lock until the
-- migration commits (every read and write of jobs waits for it, and it
-- waits for the transactions open on jobs); no row is read.
DROP TRIGGER jobs_tallies_update ON jobs;
DROP FUNCTION job_tallies_after_update();

CREATE FUNCTION job_tallies_after_update_row() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_tallies (queue, tally, n)
    SELECT NEW.queue, NEW.state::text, 1
    WHERE NEW.state IN ('done', 'failed', 'cancelled')
    UNION ALL
    SELECT OLD.queue, OLD.state::text, -1
    WHERE OLD.state IN ('done', 'failed', 'cancelled');
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_tallies_update_row AFTER UPDATE OF state, queue ON jobs
    FOR EACH ROW
    -- Cheapest test first: a claim (queued to running) stops at the first.
    WHEN ((OLD.state IN ('done', 'failed', 'cancelled')
           OR NEW.state IN ('done', 'failed', 'cancelled'))
          AND (OLD.state IS DISTINCT FROM NEW.state OR OLD.queue IS DISTINCT FROM NEW.queue)
          AND current_setting('runlease.tallies', true) IS DISTINCT FROM 'explicit')
    EXECUTE FUNCTION job_tallies_after_update_row();
