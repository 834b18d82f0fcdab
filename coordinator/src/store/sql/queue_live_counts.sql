-- Live jobs per queue and state, with the age of the oldest due claimable
-- job. Terminal totals are not counted here (see queue_tallies.sql): this
-- reads only indexes over live rows, so its cost follows the backlog and the
-- running jobs, never the history.
-- No parameters.
-- Index: jobs_claim_idx (claimable rows), jobs_running_idx (running rows)
-- and jobs_blocked_idx (blocked rows: the only state after enqueue_failed):
-- each branch's predicate is its index's, so the planner can take them
-- whatever the statistics of the terminal rows.
-- Locking: none.
SELECT queue, state::text AS state, count(*)::bigint AS jobs,
       (extract(epoch FROM now() - min(run_at) FILTER (WHERE run_at <= now())) * 1000)::bigint
           AS oldest_due_age_ms
FROM jobs
WHERE state IN ('queued', 'enqueue_failed')
GROUP BY queue, state
UNION ALL
SELECT queue, 'running', count(*)::bigint, NULL::bigint
FROM jobs
WHERE state = 'running'
GROUP BY queue
UNION ALL
SELECT queue, 'blocked', count(*)::bigint, NULL::bigint
FROM jobs
WHERE state > 'enqueue_failed'
GROUP BY queue
