-- Job counts per queue and state, with the age of the oldest due claimable job.
-- No parameters.
-- Index: none (a scan of jobs; an operations endpoint, not a hot path).
-- Locking: none.
SELECT queue, state, count(*)::bigint AS jobs,
       (extract(epoch FROM now() - min(run_at) FILTER (
            WHERE state IN ('queued', 'enqueue_failed') AND run_at <= now())) * 1000)::bigint
           AS oldest_due_age_ms
FROM jobs
GROUP BY queue, state
ORDER BY queue, state
