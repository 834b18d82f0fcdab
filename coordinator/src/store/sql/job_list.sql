-- Ids of a queue's jobs in the given states, newest first (by id: UUIDv7
-- ids sort by creation), strictly older than a cursor: one page of a
-- listing, or one chunk of a bulk action.
-- $1 text queue, $2 text[] states, $3 uuid cursor (NULL: from the newest),
-- $4 int limit, $5 timestamptz created_before (NULL: any).
-- Index: one backward range scan per state that starts at the cursor and
-- stops after the limit: page 10,000 costs what page 1 costs. Running jobs
-- are in jobs_running_idx (queue, id), every other state in jobs_list_idx
-- (queue, state, id) WHERE state <> 'running'; each branch below names its
-- index's predicate, so the planner can prove it, and only the branch of
-- the state asked for runs (the other is cut off before it reads a row).
-- The range over jobs_list_idx is written as row comparisons and ordered
-- by all three columns, which only that index can serve: with `queue = $1
-- AND state = ...` the planner may walk the primary key backwards and
-- filter, reading every newer job of other queues and states (as many as
-- the history holds) before it finds a page of a small or an old one. The
-- cursor goes through coalesce, not `IS NULL OR`, so even a generic plan
-- starts the scan at it.
-- Locking: none (a bulk action's own statement locks and re-checks rows).
SELECT c.id
FROM unnest($2::text[]) AS s(state)
CROSS JOIN LATERAL (
    (SELECT jobs.id
     FROM jobs
     WHERE s.state <> 'running' AND jobs.state <> 'running'
       AND (jobs.queue, jobs.state, jobs.id)
               < ($1::text, s.state::job_state,
                  coalesce($3::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid))
       AND (jobs.queue, jobs.state, jobs.id)
               >= ($1::text, s.state::job_state, '00000000-0000-0000-0000-000000000000'::uuid)
       AND ($5::timestamptz IS NULL OR jobs.created_at < $5::timestamptz)
     ORDER BY jobs.queue DESC, jobs.state DESC, jobs.id DESC
     LIMIT $4)
    UNION ALL
    (SELECT jobs.id
     FROM jobs
     WHERE s.state = 'running' AND jobs.state = 'running'
       AND jobs.queue = $1::text
       AND jobs.id < coalesce($3::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'::uuid)
       AND ($5::timestamptz IS NULL OR jobs.created_at < $5::timestamptz)
     ORDER BY jobs.queue DESC, jobs.id DESC
     LIMIT $4)
) c
ORDER BY c.id DESC
LIMIT $4
