-- Mark freshly enqueued jobs whose wake-up could not be published. They stay
-- claimable; the repair loop re-sends their wake-up and moves them to queued.
-- Jobs claimed in the meantime are left alone.
-- $1 uuid[] ids.
-- Index: jobs_pkey. Locking: the matched rows, for the statement.
UPDATE jobs SET state = 'enqueue_failed', updated_at = now()
WHERE id = ANY($1::uuid[]) AND state = 'queued'
RETURNING id, queue
