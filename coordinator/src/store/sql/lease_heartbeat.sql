-- Renew many leases in one statement, guarded per row on (id, state =
-- 'running', run_lease). A lease is never renewed past the attempt's timeout,
-- so a job that outlives timeout_ms is reaped even if its worker keeps beating.
-- $1 uuid[] ids, $2 bigint[] run leases, $3 jsonb[] progress (NULL keeps the
-- saved checkpoint), $4 bigint lease TTL ms, $5 bigint default timeout ms.
-- Rows that do not match are absent from the answer: those leases are lost.
-- Index: jobs_pkey.
-- Locking: the rows in id order first (no deadlock with finishing batches),
-- then the guarded UPDATE. Past its timeout a lease is not extended, but the
-- worker's checkpoint is still saved (it is what the next attempt receives).
WITH input AS (
    SELECT DISTINCT ON (id, run_lease) *
    FROM unnest($1::uuid[], $2::bigint[], $3::jsonb[]) AS t(id, run_lease, progress)
), locked AS MATERIALIZED (
    -- Locked by id alone, in id order: jobs_pkey whatever the statistics
    -- say (a state predicate here would let the planner pick a partial index
    -- and scan every running job). The guard is then checked on the locked
    -- row, which nothing else can change before this transaction ends.
    SELECT j.id, j.state, j.run_lease AS held_lease, i.run_lease, i.progress
    FROM input i
    JOIN jobs j ON j.id = i.id
    ORDER BY j.id
    FOR UPDATE OF j
)
UPDATE jobs j SET
    lease_expires_at = least(now() + $4::bigint * interval '1 millisecond',
                             j.claimed_at + coalesce(j.timeout_ms, $5::bigint) * interval '1 millisecond'),
    progress = coalesce(l.progress, j.progress),
    updated_at = now()
FROM locked l
WHERE j.id = l.id AND l.state = 'running' AND l.held_lease = l.run_lease
RETURNING j.id, j.run_lease,
          j.cancel_requested_at IS NOT NULL AS cancel_requested,
          j.lease_expires_at > now() AS live
