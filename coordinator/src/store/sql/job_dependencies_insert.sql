-- Record the dependencies of newly enqueued jobs, one row per edge.
-- $1 uuid[] dependents, $2 uuid[] their dependencies (parallel arrays),
-- $3 uuid[] the jobs the enqueue inserted (edges of a job skipped for its
-- idempotency key are left out).
-- Index: job_dependencies_pkey.
-- Locking: inserts only, in the enqueue's transaction.
INSERT INTO job_dependencies (job_id, depends_on_id)
SELECT t.job_id, t.depends_on_id
FROM unnest($1::uuid[], $2::uuid[]) AS t(job_id, depends_on_id)
WHERE t.job_id = ANY($3::uuid[])
ON CONFLICT DO NOTHING
