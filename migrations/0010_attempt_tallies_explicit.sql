-- runlease schema, version 10: the statements that write attempts count
-- them in the attempt tallies themselves (lease_expiries, retries), as
-- they count the terminal tallies since version 7.
--
-- job_attempts_tallies (version 3) is a statement-level trigger on
-- job_attempt_log with a transition table, and its function counted the
-- lease expiries and retries among the new rows. It fired for every
-- statement that can insert attempts, whether or not it inserted one:
-- every finish ran a PL/pgSQL function and its query over an empty table
-- (about 1% of the database's CPU on the 256-worker drain benchmark, more
-- with smaller batches). The finish and the reaper now add those tallies
-- in the statement that writes the attempts, from the rows they changed,
-- and mark their transactions runlease.attempt_tallies = 'explicit'; the
-- trigger runs only for inserts outside such a transaction (by hand, or
-- by a coordinator of an earlier version during a rolling upgrade).
-- (The retry of a failed job writes out its final attempt too, ending in
-- failed, which no attempt tally counts.)
--
-- Locking: DROP TRIGGER and CREATE TRIGGER take job_attempt_log's SHARE
-- ROW EXCLUSIVE lock or stronger until the migration commits; no row is
-- read.
DROP TRIGGER job_attempts_tallies ON job_attempt_log;
CREATE TRIGGER job_attempts_tallies AFTER INSERT ON job_attempt_log
    REFERENCING NEW TABLE AS new_attempts
    FOR EACH STATEMENT
    WHEN (current_setting('runlease.attempt_tallies', true) IS DISTINCT FROM 'explicit')
    EXECUTE FUNCTION job_tallies_after_attempts();
