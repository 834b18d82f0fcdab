-- Settle the dependents of jobs ended by an earlier statement of the same
-- transaction (a reap, a cancel, a delete, or a cancel of the level above):
-- follows job_dependents_settle.sql, which says what it does.
-- $1 uuid[] ended jobs, $2 text[] how each ended ('done', 'failed',
-- 'cancelled' or 'deleted'), parallel arrays; the store passes only jobs
-- whose `dependents` is not 0.
-- Tallies: the store counts the rows answered cancelled (tally::entered).
, ended AS (
    SELECT t.id, t.state
    FROM unnest($1::uuid[], $2::text[]) AS t(id, state)
)
SELECT id, run_lease, queue, state, created_at, finished_at, dependents, traced FROM settled
