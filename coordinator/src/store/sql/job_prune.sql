-- Prune: delete up to $4 jobs of one queue and terminal state that have
-- been terminal longer than the retention, oldest first. The store takes
-- the rows answered off their state's tally (tally::deleted) and deletes
-- their job_attempt_log rows (job_attempts_delete.sql, by the ids answered
-- here) in the same transaction (tally::Open::Deletes). A pruned job's own
-- dependency edges go with it. Only terminal jobs are pruned: a blocked job
-- is never, while it waits; and a pruned job's dependents were settled when
-- it ended.
-- $1 text queue, $2 text state (done, failed or cancelled), $3 bigint
-- retention ms (> 0), $4 int limit.
-- Index: jobs_prune_idx (queue, state, finished_at) WHERE terminal: a range
-- scan of expired rows only (the literal state list lets the planner use
-- the partial index).
-- Locking: FOR UPDATE SKIP LOCKED: a row a late finish is checking, or a
-- second pruner took, is left for the next pass; nothing waits on a pruner.
WITH doomed AS (
    SELECT id
    FROM jobs
    WHERE queue = $1
      AND state = $2::text::job_state
      AND state IN ('done', 'failed', 'cancelled')
      AND finished_at < now() - $3::bigint * interval '1 millisecond'
    ORDER BY finished_at
    LIMIT $4
    FOR UPDATE SKIP LOCKED
)
, gone AS (
    DELETE FROM jobs j
    USING doomed d
    WHERE j.id = d.id
    RETURNING j.id, j.queue, j.state, j.dependencies
), unlinked AS (
    DELETE FROM job_dependencies e
    USING gone g
    WHERE g.dependencies > 0 AND e.job_id = g.id
)
SELECT id, queue, state FROM gone
