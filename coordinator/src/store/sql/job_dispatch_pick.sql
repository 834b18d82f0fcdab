-- Take up to $2 due, claimable jobs of one SQS-bound queue whose due time has
-- not been signalled, and record now that their wake-ups go out. The row
-- locks end with this statement, before the wake-ups are sent, so a worker
-- woken by one can claim the job at once; should the send fail,
-- job_dispatch_unmark gives the due times back to the next pass.
-- A paused queue is skipped: its due jobs stay unsignalled (no Lambda is
-- started to claim nothing) and are signalled by the first pass after the
-- resume.
-- $1 text queue, $2 bigint limit.
-- Index: jobs_dispatch_idx (queue, run_at) WHERE claimable and not signalled;
-- queue_settings_pkey for the pause.
-- Locking: FOR UPDATE SKIP LOCKED: dispatchers on several coordinators take
-- disjoint sets, so each due time is signalled once.
WITH due AS (
    SELECT id
    FROM jobs
    WHERE queue = $1
      AND state IN ('queued', 'enqueue_failed')
      AND dispatched_run_at IS DISTINCT FROM run_at
      AND run_at <= now()
      AND NOT EXISTS (SELECT 1 FROM queue_settings s WHERE s.queue = $1 AND s.paused)
    ORDER BY run_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET dispatched_run_at = j.run_at
FROM due
WHERE j.id = due.id
RETURNING j.id, j.run_at
