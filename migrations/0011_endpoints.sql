-- runlease schema, version 11: HTTP endpoints as workers. A queue may be
-- served by an endpoint: every coordinator claims its jobs and pushes each
-- to the endpoint's URL as a signed request. The endpoint's setting, its
-- signing secrets and its health live on the queue's settings row (read
-- with the other settings into every coordinator's flow-control view).
--
-- Locking: ALTER TABLE takes queue_settings' ACCESS EXCLUSIVE lock until
-- the migration commits (a small table; claims of limited queues wait).
-- The new columns have no default to write, so no row is rewritten.

-- The endpoint: its URL, how long a request may stay open, and how many
-- requests may be open at once across every coordinator (a limit on the
-- queue's running jobs, as max_running is: the lower of the two applies).
-- All three are set together or none is.
ALTER TABLE queue_settings ADD COLUMN endpoint_url text;
ALTER TABLE queue_settings ADD COLUMN endpoint_timeout_ms integer;
ALTER TABLE queue_settings ADD COLUMN endpoint_concurrency integer;
ALTER TABLE queue_settings ADD CONSTRAINT queue_settings_endpoint CHECK (
    (endpoint_url IS NULL) = (endpoint_timeout_ms IS NULL)
    AND (endpoint_url IS NULL) = (endpoint_concurrency IS NULL)
    AND (endpoint_url IS NULL OR octet_length(endpoint_url) BETWEEN 1 AND 2048)
    AND (endpoint_timeout_ms IS NULL OR endpoint_timeout_ms BETWEEN 1000 AND 900000)
    AND (endpoint_concurrency IS NULL OR endpoint_concurrency BETWEEN 1 AND 1000));

-- The signing secrets (Standard Webhooks: whsec_ + base64 of 32 bytes).
-- The secret is made when an endpoint is first set and kept when it is
-- removed, so setting it again needs no new key at the endpoint. A rotation
-- keeps the previous secret signing beside the new one until
-- endpoint_secret_previous_until.
ALTER TABLE queue_settings ADD COLUMN endpoint_secret text;
ALTER TABLE queue_settings ADD COLUMN endpoint_secret_previous text;
ALTER TABLE queue_settings ADD COLUMN endpoint_secret_previous_until timestamptz;
ALTER TABLE queue_settings ADD CONSTRAINT queue_settings_endpoint_secret CHECK (
    (endpoint_secret_previous IS NULL) = (endpoint_secret_previous_until IS NULL)
    AND (endpoint_secret_previous IS NULL OR endpoint_secret IS NOT NULL));

-- Health as the coordinators saw it: connection failures in a row (reset
-- by a request that got an answer) and the last error. Written on a change
-- only (a failure, or the first answer after failures), never per request.
ALTER TABLE queue_settings ADD COLUMN endpoint_failures integer NOT NULL DEFAULT 0;
ALTER TABLE queue_settings ADD COLUMN endpoint_last_error text;
ALTER TABLE queue_settings ADD COLUMN endpoint_last_error_at timestamptz;
