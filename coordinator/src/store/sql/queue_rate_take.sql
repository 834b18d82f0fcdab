-- Take tokens from a queue's rate-limit bucket: what is left after a claim,
-- as of the time its limits were taken at (queue_running_count.sql).
-- $1 text queue, $2 float8 tokens left, $3 timestamptz as of.
-- Index: queue_settings_pkey. Locking: the settings row (already held).
UPDATE queue_settings SET rate_tokens = $2, rate_refilled_at = $3 WHERE queue = $1
