-- Claim up to $7 due jobs of one queue limited per concurrency key: at most
-- $6 running jobs share a key. Runs on the limited path only, in the
-- transaction that holds the queue's settings row (queue_limits_lock.sql),
-- so no other claim of this queue runs meanwhile and the counts below are
-- exact. Keys at their limit are skipped without reading their jobs (no
-- head-of-line blocking); within what the limits allow, jobs go out in
-- (priority, run_at, id) order, to the slots in order. Jobs without a key
-- are limited only by the queue's other limits.
-- $1 text queue, $2 text[] slot workers, $3 bigint lease TTL ms, $4 bigint
-- default timeout ms, $5 bigint time left ms (NULL: no limit), $6 int
-- max_running_per_key, $7 int most jobs to start, $8 timestamptz claim time
-- (the time the limits were taken at).
-- Index: jobs_claim_key_idx (queue, concurrency_key, priority, run_at, id)
-- WHERE claimable and keyed: a loose scan finds the keys that have claimable
-- jobs (one probe per key), then each key with room reads only its first
-- jobs; jobs_running_key_idx counts the running jobs per key; jobs without a
-- key come from the head of jobs_claim_idx.
-- Locking: the updated rows; the state is re-checked by the UPDATE itself.
WITH RECURSIVE keys(key) AS (
    (SELECT concurrency_key FROM jobs
     WHERE queue = $1 AND state IN ('queued', 'enqueue_failed') AND concurrency_key IS NOT NULL
     ORDER BY concurrency_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.concurrency_key FROM jobs j
            WHERE j.queue = $1 AND j.state IN ('queued', 'enqueue_failed')
              AND j.concurrency_key > keys.key
            ORDER BY j.concurrency_key LIMIT 1)
    FROM keys
    WHERE keys.key IS NOT NULL
), running AS (
    SELECT concurrency_key AS key, count(*) AS n
    FROM jobs
    WHERE queue = $1 AND state = 'running' AND concurrency_key IS NOT NULL
    GROUP BY concurrency_key
), room AS (
    SELECT k.key, $6::int - coalesce(r.n, 0) AS room
    FROM keys k
    LEFT JOIN running r ON r.key = k.key
    WHERE k.key IS NOT NULL AND $6::int - coalesce(r.n, 0) > 0
), candidates AS (
    SELECT c.id, c.priority, c.run_at
    FROM room
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at
        FROM jobs
        WHERE jobs.queue = $1 AND jobs.concurrency_key = room.key
          AND state IN ('queued', 'enqueue_failed')
          AND run_at <= now()
          AND ($5::bigint IS NULL OR coalesce(timeout_ms, $4::bigint) <= $5::bigint)
        ORDER BY priority, run_at, id
        LIMIT least(room.room, $7::int)
    ) c
    UNION ALL
    -- Jobs without a key: looked for among the first 1,000 claimable jobs
    -- of the queue (plus the slots), so the scan stops however many keyed
    -- jobs wait; an unkeyed job further back waits until those ahead go.
    (SELECT head.id, head.priority, head.run_at
     FROM (SELECT id, priority, run_at, concurrency_key
           FROM jobs
           WHERE queue = $1
             AND state IN ('queued', 'enqueue_failed')
             AND run_at <= now()
             AND ($5::bigint IS NULL OR coalesce(timeout_ms, $4::bigint) <= $5::bigint)
           ORDER BY priority, run_at, id
           LIMIT 1000 + $7::int) head
     WHERE head.concurrency_key IS NULL
     ORDER BY head.priority, head.run_at, head.id
     LIMIT $7::int)
), picked AS (
    SELECT id, row_number() OVER (ORDER BY priority, run_at, id) AS ord
    FROM candidates
    ORDER BY priority, run_at, id
    LIMIT least($7::int, cardinality($2::text[]))
)
UPDATE jobs j SET
    state = 'running',
    run_lease = j.run_lease + 1,
    attempt = j.attempt + 1,
    owned_by = ($2::text[])[p.ord::int],
    -- The claim's time: the one the limited path took its limits at (its
    -- rate tokens were counted up to it), else the statement's own.
    claimed_at = coalesce($8::timestamptz, statement_timestamp()),
    lease_expires_at = coalesce($8::timestamptz, statement_timestamp()) + least($3::bigint, coalesce(j.timeout_ms, $4::bigint))
                               * interval '1 millisecond',
    updated_at = coalesce($8::timestamptz, statement_timestamp())
FROM picked p
WHERE j.id = p.id AND j.state IN ('queued', 'enqueue_failed')
-- What a lease carries (ClaimedJob), not the whole row.
RETURNING j.id, j.queue, j.run_lease, j.payload, j.attempt, j.progress, j.timeout_ms, j.traceparent,
          j.max_attempts, j.dependencies,
          p.ord AS slot
