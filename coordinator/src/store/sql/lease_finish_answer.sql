-- The answer of lease_finish.sql (which it follows): one row per item that
-- took effect.
SELECT id, run_lease, action, queue, state, created_at, finished_at, traced FROM finished
