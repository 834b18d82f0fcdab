-- runlease schema, version 8: no trigger on jobs that runs per row or
-- copies rows. A change of state or queue, or a delete, made outside the
-- coordinator's own statements asks for the terminal tallies to be
-- counted again instead.
--
-- jobs_tallies_update_row (version 7) counted such changes row by row.
-- Its WHEN clause kept the function from running for the coordinator's
-- statements, but PostgreSQL still tested the clause for every row every
-- claim, finish and heartbeat updated (1.7% of the backends' CPU on the
-- drain benchmark).
--
-- jobs_tallies_delete (version 3) copied every deleted row into a
-- transition table for its function to count: every job pays it once,
-- when retention prunes it. The prune and the bulk delete now take their
-- jobs off the tallies themselves, as the finish adds them.
--
-- Now statement-level triggers, which read no row, fire once per UPDATE
-- statement that sets state or queue outside a transaction marked
-- runlease.tallies = 'explicit', once per DELETE outside one marked
-- runlease.tally_deletes = 'explicit', and once per TRUNCATE (an
-- operator's statement by hand, a coordinator of an earlier version
-- during a rolling upgrade), whether or not it changed a row, and append
-- one row to job_tally_recounts. After
-- its next fold of the tallies (about every second), a coordinator counts
-- the terminal jobs of every queue again and appends the difference
-- (job_tally_recount.sql), at most once a minute per coordinator, one
-- replica at a time:
-- a pass over jobs_prune_idx, whose cost follows the terminal jobs kept. The
-- coordinator's own statements never ask: they all run in marked
-- transactions. Until the recount the figures miss the change.
--
-- Locking: DROP TRIGGER takes jobs' ACCESS EXCLUSIVE lock until the
-- migration commits (every read and write of jobs waits for it, and it
-- waits for the transactions open on jobs); no row is read.
DROP TRIGGER jobs_tallies_update_row ON jobs;
DROP FUNCTION job_tallies_after_update_row();
DROP TRIGGER jobs_tallies_delete ON jobs;
DROP FUNCTION job_tallies_after_delete();

-- Requests to count the terminal tallies again; the recount deletes the
-- requests it saw. No key: requests from concurrent sessions
-- never wait on each other.
CREATE TABLE job_tally_recounts (
    requested_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION job_tallies_request_recount() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_tally_recounts DEFAULT VALUES;
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_tallies_recount_update AFTER UPDATE OF state, queue ON jobs
    FOR EACH STATEMENT
    WHEN (current_setting('runlease.tallies', true) IS DISTINCT FROM 'explicit')
    EXECUTE FUNCTION job_tallies_request_recount();
-- Deletes have a mark of their own, runlease.tally_deletes: a coordinator
-- of version 7 runs its bulk delete in a transaction marked
-- runlease.tallies = 'explicit' but writes no delta for it (its delete
-- trigger did), so that mark cannot vouch for a delete.
CREATE TRIGGER jobs_tallies_recount_delete AFTER DELETE ON jobs
    FOR EACH STATEMENT
    WHEN (current_setting('runlease.tally_deletes', true) IS DISTINCT FROM 'explicit')
    EXECUTE FUNCTION job_tallies_request_recount();
CREATE TRIGGER jobs_tallies_recount_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION job_tallies_request_recount();
