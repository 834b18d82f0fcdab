-- runlease schema, version 9: the attempt log keeps no foreign key to
-- jobs. The statements that delete jobs delete their attempts themselves;
-- a delete made anywhere else asks for a sweep of the attempts it left.
--
-- job_attempt_log.job_id referenced jobs (id) ON DELETE CASCADE. Its cost
-- fell on every job, not only on deletes: PostgreSQL checks each UPDATE of
-- a jobs row for a change of the key (fetching the row's old version to
-- compare), so every claim, heartbeat and finish paid it (1.6% of the
-- database's CPU on the drain benchmark); every attempt row written
-- checked its job with a query of its own; and the cascade ran one delete
-- query per pruned job (a fifth to a quarter of a prune statement's time).
--
-- The coordinator's prune and bulk delete now delete the attempts of the
-- jobs they deleted, in the same transaction, by the jobs' ids (one probe
-- of job_attempt_log_pkey each), and mark their transaction
-- runlease.job_deletes = 'explicit'. A DELETE of jobs outside such a
-- transaction (by hand, or by a coordinator of an earlier version during
-- a rolling upgrade, which counted on the cascade), and every TRUNCATE of
-- jobs, appends a row to job_attempt_sweeps through the statement-level
-- triggers below. After its next fold (about every second), a coordinator
-- of this version or later deletes the attempts whose job is gone, in
-- batches, at most once a minute per coordinator, one at a time, and then
-- the requests it saw (job_attempts_sweep.sql). Until then such attempts
-- stay in the log: they are only ever read by their job's id, so no answer
-- shows them. The requests have a table of their own, apart from the
-- recount requests of version 8, because a coordinator of version 8
-- serves those without sweeping.
--
-- Attempts are written only for a job row the writing statement holds
-- locked (a finish, the reaper, a retry), so no attempt can be written
-- for a job being deleted: a delete waits for that lock, and a statement
-- that waits for a delete finds no row and writes nothing.
--
-- Locking: dropping the constraint and creating the triggers take the
-- ACCESS EXCLUSIVE lock of job_attempt_log and of jobs until the migration
-- commits (it waits for the transactions open on either, and every read
-- and write of them waits for it); no row is read.
ALTER TABLE job_attempt_log DROP CONSTRAINT job_attempts_job_id_fkey;

-- Requests to sweep the attempt log; the sweep deletes the requests it
-- saw once it has swept. No key: requests from concurrent sessions never
-- wait on each other.
CREATE TABLE job_attempt_sweeps (
    requested_at timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION job_attempts_request_sweep() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_attempt_sweeps DEFAULT VALUES;
    RETURN NULL;
END
$$;

-- Only coordinators of version 9 and later set runlease.job_deletes, and
-- only on transactions whose deletes of jobs delete their attempts too.
CREATE TRIGGER jobs_attempts_sweep_delete AFTER DELETE ON jobs
    FOR EACH STATEMENT
    WHEN (current_setting('runlease.job_deletes', true) IS DISTINCT FROM 'explicit')
    EXECUTE FUNCTION job_attempts_request_sweep();
CREATE TRIGGER jobs_attempts_sweep_truncate AFTER TRUNCATE ON jobs
    FOR EACH STATEMENT
    EXECUTE FUNCTION job_attempts_request_sweep();
