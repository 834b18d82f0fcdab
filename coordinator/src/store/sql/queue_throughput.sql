-- Jobs of each given queue that reached done, failed or cancelled within the
-- last $2 ms and are still in that state: the queues' recent throughput.
-- Parameters: $1 the queues (text[]: those whose tallies hold terminal
-- jobs), $2 the window in ms (bigint).
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
      AND jobs.finished_at > now() - make_interval(secs => $2::bigint / 1000.0)
) c
