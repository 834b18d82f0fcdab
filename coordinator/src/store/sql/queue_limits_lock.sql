-- The limits of one queue, locked for a claim: claims of a limited queue run
-- one at a time (across coordinators), each in a transaction that holds this
-- row, so the running count it reads next cannot change under it by another
-- claim. A queue served by an endpoint holds its running jobs to the lower
-- of max_running and the endpoint's concurrency (LEAST ignores a NULL).
-- $1 text queue.
-- Index: queue_settings_pkey. Locking: FOR UPDATE on the settings row, until
-- the claim's transaction ends (a PATCH of the queue waits for it too).
SELECT paused, least(max_running, endpoint_concurrency) AS max_running, max_running_per_key, rate_per_s, rate_burst, rate_tokens,
       rate_refilled_at
FROM queue_settings
WHERE queue = $1
FOR UPDATE
