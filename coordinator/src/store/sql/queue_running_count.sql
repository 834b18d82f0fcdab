-- Jobs of a queue running now, and the time (PostgreSQL's clock) the
-- claim's limits are taken at: read in its own statement after
-- queue_limits_lock.sql, so its snapshot includes every claim committed
-- before the lock was granted, and its time is later than theirs (the rate
-- limit's bucket is refilled up to it; a claim's own now() is its
-- transaction's start, from before it waited for the lock).
-- $1 text queue.
-- Index: jobs_running_idx (queue, id): the range of the queue's running jobs.
-- Locking: none.
SELECT count(*)::bigint AS running, statement_timestamp() AS at
FROM jobs WHERE queue = $1 AND state = 'running'
