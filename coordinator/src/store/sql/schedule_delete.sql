-- Delete a schedule (the jobs it enqueued stay). $1 text name.
-- Index: schedules_pkey. Locking: the schedule's row.
DELETE FROM schedules WHERE name = $1 RETURNING *
