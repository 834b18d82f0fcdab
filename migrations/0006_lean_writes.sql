-- runlease schema, version 6: less written per job. The attempt that ends
-- a job lives on the job row, and running jobs take one index entry.
--
-- The attempt that ends a job lives on the job row. A complete (done) or a
-- fail that ends the job (failed) used to append its attempt to
-- job_attempts in the same statement: a second row, its
-- primary-key entry and a foreign-key check per job, the largest single cost
-- of finishing one. The job row already holds every field of that attempt
-- (run_lease, owned_by, claimed_at, finished_at, error, state), so the
-- finish now only records how the attempt ended (final_outcome), and the
-- attempt is written out as a row only if the job is retried (the admin
-- retry of a failed job writes it in the statement that re-queues it).
-- Attempts that leave the job queued or cancelled, and every reaped one,
-- are written as rows as before.
--
-- The rows move to job_attempt_log; job_attempts becomes a view of both,
-- with the same columns, so every reader (and every query an operator
-- keeps) sees the same chronology as before: one row per ended lease.
--
-- Locking: the first statement takes jobs' ACCESS EXCLUSIVE lock and holds
-- it until the migration commits, so every read and write of jobs waits for
-- the whole migration, two index builds included (a pass over the table
-- each; see the end). The column and the check themselves read no row: a
-- nullable column without a default is recorded in the catalog only, and
-- the check is NOT VALID (every existing row holds NULL).
ALTER TABLE jobs ADD COLUMN final_outcome attempt_outcome;
-- Only a finish that ends a job records its attempt here, and only as
-- completed (done) or failed (failed); the job leaves those states only
-- through a retry, which writes the attempt out and clears the column.
ALTER TABLE jobs ADD CONSTRAINT jobs_final_outcome_terminal CHECK (
    final_outcome IS NULL
    OR (state = 'done' AND final_outcome = 'completed')
    OR (state = 'failed' AND final_outcome = 'failed')) NOT VALID;

ALTER TABLE job_attempts RENAME TO job_attempt_log;
ALTER INDEX job_attempts_pkey RENAME TO job_attempt_log_pkey;

-- The chronology: the rows written out, and the final attempt of each job
-- that has one on its row. A lookup by job_id reaches both through their
-- primary keys.
CREATE VIEW job_attempts AS
SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after
FROM job_attempt_log
UNION ALL
SELECT id, run_lease, owned_by, claimed_at, finished_at, final_outcome,
       CASE WHEN final_outcome = 'failed' THEN error END, state
FROM jobs
WHERE final_outcome IS NOT NULL;

-- Coordinators of the previous version, still running during a rolling
-- upgrade, append every ended attempt to job_attempts: their rows go to the
-- log. (They leave final_outcome NULL, so no attempt is recorded twice.
-- Their admin retry does not clear final_outcome: a retry of a job failed
-- by a new coordinator, sent to an old one, is refused by the check above
-- and changes nothing; it goes through on a new one.)
CREATE FUNCTION job_attempts_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after)
    VALUES (NEW.job_id, NEW.run_lease, NEW.worker_id, NEW.claimed_at, NEW.finished_at, NEW.outcome, NEW.error,
            NEW.state_after);
    RETURN NEW;
END
$$;
CREATE TRIGGER job_attempts_insert INSTEAD OF INSERT ON job_attempts
    FOR EACH ROW EXECUTE FUNCTION job_attempts_insert();

-- Running jobs get one index instead of two. jobs_reap_idx (by lease expiry)
-- and the running range of jobs_list_idx both took an entry at every claim,
-- and every heartbeat, which moves lease_expires_at, had to add index
-- entries for a new row version (never a HOT update). jobs_running_idx
-- (queue, id) serves listing, counting and reaping the running jobs: its
-- key never changes while a job runs, so a heartbeat changes no indexed
-- column and PostgreSQL can update the row in place (HOT) when its page has
-- room. The reaper now reads the running jobs (not only the expired ones):
-- its cost follows the jobs running, never the history.
-- Note: the two index builds below each take a pass over jobs, with every
-- reader and writer of jobs waiting (the lock taken above).
CREATE INDEX jobs_running_idx ON jobs (queue, id) WHERE state = 'running';
DROP INDEX jobs_reap_idx;
CREATE INDEX jobs_list_idx_v6 ON jobs (queue, state, id) WHERE state <> 'running';
DROP INDEX jobs_list_idx;
ALTER INDEX jobs_list_idx_v6 RENAME TO jobs_list_idx;
-- Room on each page for a heartbeat's new row version beside the old one
-- (applies to pages written from now on).
ALTER TABLE jobs SET (fillfactor = 90);
