-- The dependencies of jobs, with each one's state and result now (NULL:
-- the dependency was deleted): what a lease of a job with dependencies
-- carries. The store asks only for jobs whose `dependencies` is not 0.
-- $1 uuid[] jobs.
-- Index: job_dependencies_pkey (the edges of each job), then jobs_pkey.
-- Locking: none.
SELECT d.job_id, d.depends_on_id AS id, j.state, j.result
FROM job_dependencies d
LEFT JOIN jobs j ON j.id = d.depends_on_id
WHERE d.job_id = ANY($1::uuid[])
ORDER BY d.job_id, d.depends_on_id
