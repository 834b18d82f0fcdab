-- Lock up to $1 unpaused schedules whose next fire time has come, with
-- PostgreSQL's clock: the fire pass enqueues their jobs, then moves them on.
-- Index: schedules_due_idx (next_fire_at) WHERE NOT paused.
-- Locking: FOR UPDATE SKIP LOCKED, so coordinators running the pass at once
-- take different schedules (and a fire time's job carries an idempotency
-- key, so even a repeat after a crash enqueues it once).
SELECT *, now() AS now
FROM schedules
WHERE NOT paused AND next_fire_at <= now()
ORDER BY next_fire_at
LIMIT $1
FOR UPDATE SKIP LOCKED
