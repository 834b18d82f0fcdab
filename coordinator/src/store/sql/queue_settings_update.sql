-- Change a queue's settings, creating its row if it has none (the store
-- then reads them back with queue_settings_list.sql). For each
-- nullable setting a flag says whether to set it (the value may be NULL:
-- cleared); an unflagged setting keeps its value.
-- $1 text queue, $2 bool paused (NULL: unchanged),
-- $3 bool set max_running, $4 int max_running,
-- $5 bool set max_running_per_key, $6 int max_running_per_key,
-- $7 bool set rate limit, $8 float8 rate per_s, $9 int rate burst,
-- $10 bool set retention_done_ms, $11 bigint retention_done_ms,
-- $12 bool set retention_failed_ms, $13 bigint retention_failed_ms,
-- $14 bool set the endpoint, $15 text endpoint url (NULL: removed),
-- $16 int endpoint timeout_ms, $17 int endpoint concurrency,
-- $18 text a new endpoint secret, kept only when the queue has none yet (a
-- secret outlives the removal of its endpoint). Setting the endpoint
-- resets its health.
-- $19 bool set max_attempts, $20 int max_attempts,
-- $21 bool set the backoff (replaced whole: a field not given is NULL, the
-- coordinator's default), $22 bigint base_ms, $23 bigint max_ms, $24 float8
-- factor, $25 float8 jitter,
-- $26 bool set retry_window_ms, $27 bigint retry_window_ms,
-- $28 bool set dead_letter_queue, $29 text dead_letter_queue.
-- Index: queue_settings_pkey. Locking: the queue's settings row.
INSERT INTO queue_settings AS s (queue, paused, max_running, max_running_per_key,
                                 rate_per_s, rate_burst, retention_done_ms, retention_failed_ms,
                                 endpoint_url, endpoint_timeout_ms, endpoint_concurrency,
                                 endpoint_secret, max_attempts, backoff_base_ms, backoff_max_ms,
                                 backoff_factor, backoff_jitter, retry_window_ms, dead_letter_queue)
VALUES ($1, coalesce($2::bool, false),
        CASE WHEN $3::bool THEN $4::int END,
        CASE WHEN $5::bool THEN $6::int END,
        CASE WHEN $7::bool THEN $8::float8 END,
        CASE WHEN $7::bool THEN $9::int END,
        CASE WHEN $10::bool THEN $11::bigint END,
        CASE WHEN $12::bool THEN $13::bigint END,
        CASE WHEN $14::bool THEN $15::text END,
        CASE WHEN $14::bool AND $15::text IS NOT NULL THEN $16::int END,
        CASE WHEN $14::bool AND $15::text IS NOT NULL THEN $17::int END,
        CASE WHEN $14::bool AND $15::text IS NOT NULL THEN $18::text END,
        CASE WHEN $19::bool THEN $20::int END,
        CASE WHEN $21::bool THEN $22::bigint END,
        CASE WHEN $21::bool THEN $23::bigint END,
        CASE WHEN $21::bool THEN $24::float8 END,
        CASE WHEN $21::bool THEN $25::float8 END,
        CASE WHEN $26::bool THEN $27::bigint END,
        CASE WHEN $28::bool THEN $29::text END)
ON CONFLICT (queue) DO UPDATE SET
    paused = coalesce($2::bool, s.paused),
    max_running = CASE WHEN $3::bool THEN $4::int ELSE s.max_running END,
    max_running_per_key = CASE WHEN $5::bool THEN $6::int ELSE s.max_running_per_key END,
    rate_per_s = CASE WHEN $7::bool THEN $8::float8 ELSE s.rate_per_s END,
    rate_burst = CASE WHEN $7::bool THEN $9::int ELSE s.rate_burst END,
    retention_done_ms = CASE WHEN $10::bool THEN $11::bigint ELSE s.retention_done_ms END,
    retention_failed_ms = CASE WHEN $12::bool THEN $13::bigint ELSE s.retention_failed_ms END,
    endpoint_url = CASE WHEN $14::bool THEN $15::text ELSE s.endpoint_url END,
    endpoint_timeout_ms = CASE WHEN $14::bool THEN
                              CASE WHEN $15::text IS NOT NULL THEN $16::int END
                          ELSE s.endpoint_timeout_ms END,
    endpoint_concurrency = CASE WHEN $14::bool THEN
                               CASE WHEN $15::text IS NOT NULL THEN $17::int END
                           ELSE s.endpoint_concurrency END,
    endpoint_secret = CASE WHEN $14::bool AND $15::text IS NOT NULL
                           THEN coalesce(s.endpoint_secret, $18::text)
                      ELSE s.endpoint_secret END,
    endpoint_failures = CASE WHEN $14::bool THEN 0 ELSE s.endpoint_failures END,
    endpoint_last_error = CASE WHEN $14::bool THEN NULL ELSE s.endpoint_last_error END,
    endpoint_last_error_at = CASE WHEN $14::bool THEN NULL ELSE s.endpoint_last_error_at END,
    max_attempts = CASE WHEN $19::bool THEN $20::int ELSE s.max_attempts END,
    backoff_base_ms = CASE WHEN $21::bool THEN $22::bigint ELSE s.backoff_base_ms END,
    backoff_max_ms = CASE WHEN $21::bool THEN $23::bigint ELSE s.backoff_max_ms END,
    backoff_factor = CASE WHEN $21::bool THEN $24::float8 ELSE s.backoff_factor END,
    backoff_jitter = CASE WHEN $21::bool THEN $25::float8 ELSE s.backoff_jitter END,
    retry_window_ms = CASE WHEN $26::bool THEN $27::bigint ELSE s.retry_window_ms END,
    dead_letter_queue = CASE WHEN $28::bool THEN $29::text ELSE s.dead_letter_queue END,
    updated_at = now()
RETURNING queue
