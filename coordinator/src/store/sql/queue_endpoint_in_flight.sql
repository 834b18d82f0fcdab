-- Running jobs of a queue its endpoint holds (requests open, and 202
-- hand-offs), across every coordinator.
-- $1 text queue, $2 text the endpoint's worker id.
-- Index: jobs_running_idx (queue, id); the running jobs of one queue
-- are few (at most max_running or the endpoint's concurrency). Locking: none.
SELECT count(*) AS n FROM jobs WHERE queue = $1 AND state = 'running' AND owned_by = $2
