-- The opening of a statement that acts on jobs by id ($1 uuid[]): their
-- rows locked in id order (the order every batch statement locks in), as
-- the CTE `locked`. The store puts it before job_cancel.sql and
-- job_delete.sql, which go on from it.
-- Index: jobs_pkey.
WITH locked AS MATERIALIZED (
    SELECT id
    FROM jobs
    WHERE id = ANY($1::uuid[])
    ORDER BY id
    FOR UPDATE
)
