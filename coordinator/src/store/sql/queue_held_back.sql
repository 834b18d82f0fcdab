-- Due claimable jobs of a queue that its settings keep from starting now:
-- all of them while it is paused, at max_running (or its endpoint's
-- concurrency, when lower) or out of rate-limit tokens; otherwise those whose concurrency key is at max_running_per_key.
-- $1 text queue.
-- Index: jobs_running_idx and jobs_running_key_idx for what runs, jobs_claim_idx
-- for the due jobs
-- (a pass over the queue's backlog: figures of queues with settings only).
-- Locking: none.
WITH s AS (
    SELECT * FROM queue_settings WHERE queue = $1
), running AS (
    SELECT count(*) AS n FROM jobs WHERE queue = $1 AND state = 'running'
), all_held AS (
    SELECT coalesce((SELECT paused FROM s), false)
        OR coalesce((SELECT least(max_running, endpoint_concurrency) FROM s) <= (SELECT n FROM running), false)
        OR coalesce((SELECT least(rate_burst::float8,
                                  coalesce(rate_tokens, rate_burst::float8)
                                  + rate_per_s * greatest(0, extract(epoch FROM now() - coalesce(rate_refilled_at, now()))))
                            < 1
                     FROM s WHERE rate_per_s IS NOT NULL), false) AS yes
), full_keys AS (
    SELECT concurrency_key
    FROM jobs
    WHERE queue = $1 AND state = 'running' AND concurrency_key IS NOT NULL
    GROUP BY concurrency_key
    HAVING count(*) >= (SELECT max_running_per_key FROM s)
)
SELECT count(*)::bigint AS held
FROM jobs j
WHERE j.queue = $1 AND j.state IN ('queued', 'enqueue_failed') AND j.run_at <= now()
  AND ((SELECT yes FROM all_held) OR j.concurrency_key IN (SELECT concurrency_key FROM full_keys))
