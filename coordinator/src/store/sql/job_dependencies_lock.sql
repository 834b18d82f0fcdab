-- Lock the existing jobs an enqueue names as dependencies, in id order, and
-- count its new dependents on each (`dependents`), answering each one's
-- state as it is now: a dependency ended meanwhile is seen ended (the
-- enqueue settles its new job at once), and one that ends later is ended
-- by a statement that waits for this transaction's commit, or that sees
-- `dependents` moved past its snapshot (job_dependents_settle.sql).
-- $1 uuid[] ids, $2 int[] new dependents of each (parallel arrays, each id
-- once). Ids absent from the answer name no job (deleted, or never were).
-- Index: jobs_pkey.
-- Locking: FOR UPDATE in id order, then the update of the same rows.
WITH locked AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE id = ANY($1::uuid[])
    ORDER BY id
    FOR UPDATE
)
UPDATE jobs j SET dependents = j.dependents + t.n
FROM locked l
JOIN unnest($1::uuid[], $2::int[]) AS t(id, n) ON t.id = l.id
WHERE j.id = l.id
RETURNING j.id, j.state
