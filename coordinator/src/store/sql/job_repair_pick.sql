-- Lock up to $1 enqueue_failed jobs for one repair pass, oldest first. The
-- locks are held while the wake-ups are published, then job_repair_requeue
-- runs in the same transaction.
-- $1 bigint limit.
-- Index: jobs_enqueue_failed_idx (created_at) WHERE enqueue_failed.
-- Locking: FOR UPDATE SKIP LOCKED: repair loops on several coordinators take
-- disjoint sets, so each job is repaired once.
SELECT id, queue
FROM jobs
WHERE state = 'enqueue_failed'
ORDER BY created_at
LIMIT $1
FOR UPDATE SKIP LOCKED
