-- Settings of queues: $1 text[] queues (NULL: every queue with settings).
-- Index: queue_settings_pkey. Locking: none.
SELECT queue, paused, max_running, max_running_per_key, rate_per_s, rate_burst,
       retention_done_ms, retention_failed_ms, updated_at
FROM queue_settings
WHERE $1::text[] IS NULL OR queue = ANY($1::text[])
ORDER BY queue
