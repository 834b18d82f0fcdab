-- Record the dependencies of newly enqueued jobs, one row per edge.
-- $1 uuid[] dependents, $2 uuid[] their dependencies (parallel arrays),
-- $3 uuid[] the jobs the enqueue inserted (edges of a job skipped for its
-- idempotency key are left out).
-- Index: job_dependencies_pkey; jobs_pkey (each dependency's state).
-- Locking: inserts only, in the enqueue's transaction.
-- An edge to a dependency that has already ended (or that no job is) was
-- counted by the enqueue itself: it is recorded settled, so the dependency
-- ending again after an admin retry does not count it twice. The
-- dependencies are read as the enqueue left them (existing ones locked by
-- it, earlier jobs of the enqueue inserted by it).
INSERT INTO job_dependencies (job_id, depends_on_id, settled)
SELECT t.job_id, t.depends_on_id,
       coalesce(d.state IN ('done', 'failed', 'cancelled'), true)
FROM unnest($1::uuid[], $2::uuid[]) AS t(job_id, depends_on_id)
LEFT JOIN jobs d ON d.id = t.depends_on_id
WHERE t.job_id = ANY($3::uuid[])
ON CONFLICT DO NOTHING
