-- Read jobs by id. $1 uuid[] ids.
-- Index: jobs_pkey. Locking: none.
SELECT * FROM jobs WHERE id = ANY($1::uuid[])
