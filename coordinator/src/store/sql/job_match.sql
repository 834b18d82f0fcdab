-- Which of the given jobs are in a queue, in one of the states and created
-- before a time: the ids a bulk action that names its jobs applies to.
-- $1 uuid[] ids, $2 text queue, $3 text[] states, $4 timestamptz
-- created_before (NULL: any).
-- Index: jobs_pkey. Locking: none.
SELECT id
FROM jobs
WHERE id = ANY($1::uuid[])
  AND queue = $2
  AND state::text = ANY($3::text[])
  AND ($4::timestamptz IS NULL OR created_at < $4::timestamptz)
ORDER BY id DESC
