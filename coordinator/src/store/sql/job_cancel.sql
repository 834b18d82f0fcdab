-- Cancel jobs: a claimable or blocked job becomes cancelled at once; a running job
-- keeps running with cancel_requested_at set until its worker acknowledges
-- (fail or release) or the reaper finds its lease expired. Terminal jobs,
-- and running jobs whose cancel was already requested, are untouched
-- (absent from the answer).
-- $1 uuid[] ids, $2 text[] states the job must still be in (a bulk action's
-- filter, re-checked on the locked row; NULL: any).
-- Tallies: the store counts the rows answered cancelled (tally::entered).
-- Dependents: a job cancelled here with `dependents` not 0 has them settled
-- by job_dependents_settled.sql in the same transaction.
-- Follows jobs_locked_by_id.sql: `locked` is the rows of $1, locked in id
-- order.
, cancelled AS (
    UPDATE jobs j SET
        state = CASE WHEN j.state = 'running' THEN j.state ELSE 'cancelled'::job_state END,
        cancel_requested_at = CASE WHEN j.state = 'running' THEN now() END,
        finished_at = CASE WHEN j.state = 'running' THEN NULL ELSE now() END,
        -- Only a blocked job has any (job_dependents_settle.sql).
        dependencies_pending = 0,
        updated_at = now()
    FROM locked l
    WHERE j.id = l.id
      AND (j.state IN ('queued', 'enqueue_failed', 'blocked')
           OR (j.state = 'running' AND j.cancel_requested_at IS NULL))
      AND ($2::text[] IS NULL OR j.state::text = ANY($2::text[]))
    RETURNING j.id, j.queue, j.state, j.created_at, j.finished_at, j.dependents
)
SELECT id, queue, state, created_at, finished_at, dependents FROM cancelled
