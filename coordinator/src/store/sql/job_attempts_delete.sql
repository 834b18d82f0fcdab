-- Delete the attempts of jobs the transaction has just deleted
-- (job_prune.sql, job_delete.sql): job_attempt_log keeps no foreign key to
-- jobs (migration 9), so what deletes a job deletes its attempts. Its own
-- statement, after the delete, so its snapshot sees every attempt written
-- before the jobs were locked; none can be written after (attempts are
-- written only for a job row their statement holds locked, and the rows
-- are deleted).
-- $1 uuid[] ids of the deleted jobs. Answers nothing.
-- Index: job_attempt_log_pkey (job_id, run_lease), one probe per id.
-- Locking: the attempt rows it deletes (nothing else writes them).
DELETE FROM job_attempt_log
WHERE job_id = ANY($1::uuid[])
