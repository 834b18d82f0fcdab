-- Jobs of each given queue that reached done, failed or cancelled within the
-- last minute and are still in that state: the queues' recent throughput.
-- Parameters: $1 the queues (text[]: those whose tallies hold terminal
-- jobs). The window, one minute, is written here rather than passed: with
-- a parameter a generic plan guesses a third of the index for the range
-- and costs itself into JIT compilation; with the literal every plan
-- estimates the range from the index's statistics.
-- Index: jobs_prune_idx (queue, state, finished_at) WHERE terminal: one
-- range per (queue, state), starting at the window's edge, so the cost
-- follows the jobs that ended inside the window, never the history.
-- Locking: none.
SELECT q.queue, s.state::text AS state, c.n
FROM unnest($1::text[]) AS q(queue)
CROSS JOIN unnest('{done,failed,cancelled}'::job_state[]) AS s(state)
CROSS JOIN LATERAL (
    SELECT count(*)::bigint AS n
    FROM jobs
    WHERE jobs.queue = q.queue
      AND jobs.state = s.state
      -- The partial index's own predicate, which the planner cannot
      -- derive from the lateral state.
      AND jobs.state IN ('done', 'failed', 'cancelled')
      AND jobs.finished_at > now() - interval '1 minute'
) c
