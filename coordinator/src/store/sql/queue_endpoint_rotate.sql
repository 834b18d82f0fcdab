-- Rotate a queue's endpoint secret: the new one signs from now on, the
-- current one keeps signing beside it until the window ends. A rotation
-- inside the window of an earlier one drops the oldest secret.
-- $1 text queue, $2 text the new secret, $3 bigint the window, ms.
-- Answers nothing when the queue has no secret (no endpoint was ever set).
-- Index: queue_settings_pkey. Locking: the queue's settings row.
UPDATE queue_settings SET
    endpoint_secret_previous = endpoint_secret,
    endpoint_secret_previous_until = now() + $3::bigint * interval '1 millisecond',
    endpoint_secret = $2::text,
    updated_at = now()
WHERE queue = $1 AND endpoint_secret IS NOT NULL
RETURNING endpoint_secret, endpoint_secret_previous, endpoint_secret_previous_until
