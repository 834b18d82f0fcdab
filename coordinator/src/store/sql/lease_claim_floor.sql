-- The claim floor of queues: per queue, the first claimable job at or above
-- the floor the scan is given, as (priority, run_at, id), whether it is due
-- or not and whether another transaction holds it locked (no SKIP LOCKED:
-- a job a concurrent claim holds is still claimable until that claim
-- commits). No claimable job of the queue sorts below what this answers,
-- except those written after this statement's snapshot, which the
-- coordinator learns of from their wake-ups (store/floors.rs).
-- $1 text[] queues, $2 int[], $3 timestamptz[], $4 uuid[] where each
-- queue's scan starts (NULL elements, or NULL arrays: at the queue's first
-- entry). Answers one row per queue; `found` false when the queue holds no
-- claimable job at or above the start. `at` is the statement's time.
-- The claim runs it in its own transaction after its claims, so the jobs
-- it just claimed are no longer claimable here; a full scan (NULL starts)
-- runs now and then outside any claim to find jobs a floor passed.
-- Index: jobs_claim_idx (queue, priority, run_at, id) WHERE claimable, one
-- ordered scan per queue from its start, stopping at the first live entry:
-- it walks the entries of jobs claimed since the start was taken, no more.
-- Locking: none.
SELECT q.queue,
       f.id IS NOT NULL AS found,
       f.priority,
       f.run_at,
       f.id,
       statement_timestamp() AS at
FROM unnest($1::text[], $2::int[], $3::timestamptz[], $4::uuid[])
     AS q(queue, floor_priority, floor_run_at, floor_id)
LEFT JOIN LATERAL (
    SELECT priority, run_at, id
    FROM jobs
    WHERE jobs.queue = q.queue
      AND (priority, run_at, id) >= (coalesce(q.floor_priority, -2147483648),
                                     coalesce(q.floor_run_at, '-infinity'),
                                     coalesce(q.floor_id, '00000000-0000-0000-0000-000000000000'))
      AND state IN ('queued', 'enqueue_failed')
    ORDER BY priority, run_at, id
    LIMIT 1
) f ON true
