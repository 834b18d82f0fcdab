-- Move repaired jobs back to queued once their wake-up went out.
-- $1 uuid[] ids (locked by job_repair_pick in this transaction).
-- Index: jobs_pkey. Locking: rows already held.
UPDATE jobs SET state = 'queued', updated_at = now()
WHERE id = ANY($1::uuid[]) AND state = 'enqueue_failed'
RETURNING queue
