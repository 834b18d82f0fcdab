-- Ids of a queue's jobs in the given states, newest first (by id: UUIDv7
-- ids sort by creation), strictly older than a cursor: one page of a
-- listing, or one chunk of a bulk action.
-- $1 text queue, $2 text[] states, $3 uuid cursor (NULL: from the newest),
-- $4 int limit, $5 timestamptz created_before (NULL: any).
-- Index: jobs_list_idx (queue, state, id), one backward range scan per state
-- that starts at the cursor and stops after the limit: page 10,000 costs
-- what page 1 costs. The cursor goes through coalesce, not `IS NULL OR`, so
-- even a generic plan keeps it as the scan's start.
-- Locking: none (a bulk action's own statement locks and re-checks rows).
SELECT c.id
FROM unnest($2::text[]) AS s(state)
CROSS JOIN LATERAL (
    SELECT id
    FROM jobs
    WHERE jobs.queue = $1
      AND jobs.state = s.state::job_state
      AND jobs.id < coalesce($3::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)
      AND ($5::timestamptz IS NULL OR jobs.created_at < $5::timestamptz)
    ORDER BY jobs.id DESC
    LIMIT $4
) c
ORDER BY c.id DESC
LIMIT $4
