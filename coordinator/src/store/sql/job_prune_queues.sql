-- The queues that hold terminal jobs, for a prune pass: a loose index scan
-- (one probe per queue) rather than a read of the history, and independent
-- of the tallies, so pruning finds every terminal row however it got there.
-- No parameters.
-- Index: jobs_prune_idx (queue, state, finished_at) WHERE terminal.
-- Locking: none.
WITH RECURSIVE q(queue) AS (
    (SELECT queue FROM jobs
     WHERE state IN ('done', 'failed', 'cancelled')
     ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs j
            WHERE j.state IN ('done', 'failed', 'cancelled') AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM q
    WHERE q.queue IS NOT NULL
)
SELECT queue FROM q WHERE queue IS NOT NULL
