-- The wake-ups of these jobs could not be sent: give their due times back to
-- the next dispatch pass, unless something moved them since (a claim, or a
-- new due time that is its own wake-up).
-- $1 uuid[] ids, $2 timestamptz[] the run_at each was marked for.
-- Index: jobs_pkey. Locking: the matched rows, for the statement.
UPDATE jobs j SET dispatched_run_at = NULL
FROM unnest($1::uuid[], $2::timestamptz[]) AS u(id, run_at)
WHERE j.id = u.id AND j.dispatched_run_at = u.run_at
