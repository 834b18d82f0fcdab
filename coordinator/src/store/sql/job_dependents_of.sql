-- The dependents of jobs, with each one's state now: the first $2 (by id,
-- which is creation order) of each job. The store asks only for jobs whose
-- `dependents` is not 0.
-- $1 uuid[] jobs, $2 int most per job.
-- Index: job_dependencies_depends_on_idx, then jobs_pkey.
-- Locking: none.
SELECT o.id AS depends_on_id, x.job_id AS id, x.state
FROM unnest($1::uuid[]) AS o(id)
CROSS JOIN LATERAL (
    SELECT d.job_id, j.state
    FROM job_dependencies d
    LEFT JOIN jobs j ON j.id = d.job_id
    WHERE d.depends_on_id = o.id
    ORDER BY d.job_id
    LIMIT $2::int
) x
ORDER BY o.id, x.job_id
