-- Read the jobs that own the given (queue, idempotency_key) pairs.
-- $1 text[] queues, $2 text[] keys (parallel arrays).
-- Index: jobs_idempotency_key_uniq. Locking: none.
SELECT j.*
FROM unnest($1::text[], $2::text[]) AS k(queue, idempotency_key)
JOIN jobs j ON j.queue = k.queue AND j.idempotency_key = k.idempotency_key
