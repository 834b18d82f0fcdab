-- runlease schema, version 8: no per-row trigger on updates of jobs. A
-- change of state or queue made outside the coordinator's own statements
-- asks for the terminal tallies to be counted again instead.
--
-- jobs_tallies_update_row (version 7) counted such changes row by row.
-- Its WHEN clause kept the function from running for the coordinator's
-- statements, but PostgreSQL fetches the old version of every updated row
-- for an AFTER ROW trigger before it looks at the clause: one more heap
-- fetch per row for every claim, finish and heartbeat (about 3.5% of the
-- server's CPU on the drain benchmark).
--
-- Now a statement-level trigger, which reads no row, fires once per UPDATE
-- statement that sets state or queue outside a transaction marked
-- runlease.tallies = 'explicit' (an operator's UPDATE by hand, a
-- coordinator of a version before 7 during a rolling upgrade), whether or
-- not it changed a row, and appends one row to job_tally_recounts. After
-- its next fold of the tallies (about every second), the replica that
-- holds the prune lock counts the terminal jobs of every queue again
-- (job_tally_recount.sql), at most once a minute: a pass over
-- jobs_prune_idx, whose cost follows the terminal jobs kept. The
-- coordinator's own statements never ask: they all run in marked
-- transactions. Until the recount the figures miss the change. Deletes
-- keep their statement-level trigger (jobs_tallies_delete).
--
-- Locking: DROP TRIGGER takes jobs' ACCESS EXCLUSIVE lock until the
-- migration commits (every read and write of jobs waits for it, and it
-- waits for the transactions open on jobs); no row is read.
DROP TRIGGER jobs_tallies_update_row ON jobs;
DROP FUNCTION job_tallies_after_update_row();

-- Requests to count the terminal tallies again; the fold that does it
-- deletes the requests it saw. No key: requests from concurrent sessions
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

CREATE TRIGGER jobs_tallies_recount AFTER UPDATE OF state, queue ON jobs
    FOR EACH STATEMENT
    WHEN (current_setting('runlease.tallies', true) IS DISTINCT FROM 'explicit')
    EXECUTE FUNCTION job_tallies_request_recount();
