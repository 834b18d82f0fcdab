-- Schedules by name: $1 text name (NULL: every schedule).
-- Index: schedules_pkey. Locking: none.
SELECT * FROM schedules WHERE $1::text IS NULL OR name = $1 ORDER BY name
