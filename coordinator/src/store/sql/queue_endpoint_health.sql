-- Record what a coordinator saw of a queue's endpoint: $2 bool true for a
-- failure to connect (one more in a row), false for an answer (the count
-- starts again); $3 text the error (NULL keeps the last one). Written on a
-- change of health only, never per request.
-- $1 text queue.
-- Index: queue_settings_pkey. Locking: the queue's settings row, briefly.
UPDATE queue_settings SET
    endpoint_failures = CASE WHEN $2::bool THEN endpoint_failures + 1 ELSE 0 END,
    endpoint_last_error = coalesce($3::text, endpoint_last_error),
    endpoint_last_error_at = CASE WHEN $3::text IS NOT NULL THEN now() ELSE endpoint_last_error_at END
WHERE queue = $1 AND endpoint_url IS NOT NULL
