-- Create or replace a schedule. Its next fire time is computed by the
-- coordinator from the cron expression and PostgreSQL's clock; a replaced
-- schedule keeps its creation and last fire times.
-- $1 text name, $2 text queue, $3 text cron, $4 text timezone, $5 jsonb
-- payload, $6 int priority, $7 int max_attempts (NULL: default), $8 bigint
-- timeout_ms (NULL: default), $9 bool paused, $10 timestamptz next fire.
-- Index: schedules_pkey. Locking: the schedule's row.
INSERT INTO schedules AS s (name, queue, cron, timezone, payload, priority, max_attempts,
                            timeout_ms, paused, next_fire_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (name) DO UPDATE SET
    queue = EXCLUDED.queue, cron = EXCLUDED.cron, timezone = EXCLUDED.timezone,
    payload = EXCLUDED.payload, priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts, timeout_ms = EXCLUDED.timeout_ms,
    paused = EXCLUDED.paused, next_fire_at = EXCLUDED.next_fire_at, updated_at = now()
RETURNING *, (xmax = 0) AS created
