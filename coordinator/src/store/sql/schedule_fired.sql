-- Record that a schedule's fire time was enqueued and move it to the next.
-- $1 text name, $2 timestamptz fire time enqueued, $3 timestamptz next.
-- Index: schedules_pkey. Locking: the schedule's row (held by schedule_due).
UPDATE schedules SET last_fired_at = $2, next_fire_at = $3, updated_at = now()
WHERE name = $1
