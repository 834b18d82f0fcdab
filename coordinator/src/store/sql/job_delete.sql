-- Delete terminal and blocked jobs; queued, running and enqueue_failed
-- jobs are never deleted. A deleted job's own dependency edges go with it;
-- one with `dependents` not 0 has them settled (a deleted dependency
-- fails) by job_dependents_settled.sql in the same transaction. The store then deletes their job_attempt_log rows
-- (job_attempts_delete.sql, by the ids answered here) in the same
-- transaction.
-- Tallies: the store takes the rows answered off their state's tally
-- (tally::deleted), in a transaction opened with tally::Open::Deletes.
-- $1 uuid[] ids, $2 text[] states the job must still be in (a bulk action's
-- filter, re-checked on the locked row; NULL: any).
-- Follows jobs_locked_by_id.sql: `locked` is the rows of $1, locked in id
-- order.
, gone AS (
    DELETE FROM jobs j
    USING locked l
    WHERE j.id = l.id AND j.state IN ('done', 'failed', 'cancelled', 'blocked')
      AND ($2::text[] IS NULL OR j.state::text = ANY($2::text[]))
    RETURNING j.id, j.queue, j.state, j.dependencies, j.dependents
), unlinked AS (
    DELETE FROM job_dependencies d
    USING gone g
    WHERE g.dependencies > 0 AND d.job_id = g.id
)
SELECT id, queue, state, dependents FROM gone
