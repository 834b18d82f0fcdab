-- Settings of queues: $1 text[] queues (NULL: every queue with settings).
-- The previous endpoint secret is answered only while it still signs.
-- Index: queue_settings_pkey. Locking: none.
SELECT queue, paused, max_running, max_running_per_key, rate_per_s, rate_burst,
       retention_done_ms, retention_failed_ms, updated_at,
       endpoint_url, endpoint_timeout_ms, endpoint_concurrency, endpoint_secret,
       CASE WHEN endpoint_secret_previous_until > now() THEN endpoint_secret_previous END
           AS endpoint_secret_previous,
       CASE WHEN endpoint_secret_previous_until > now() THEN endpoint_secret_previous_until END
           AS endpoint_secret_previous_until,
       endpoint_failures, endpoint_last_error, endpoint_last_error_at,
       max_attempts, backoff_base_ms, backoff_max_ms, backoff_factor, backoff_jitter, retry_window_ms,
       dead_letter_queue
FROM queue_settings
WHERE $1::text[] IS NULL OR queue = ANY($1::text[])
ORDER BY queue
