UPDATE jobs j SET
    state = 'running',
    run_lease = j.run_lease + 1,
    attempt = j.attempt + 1,
    -- The slot's worker by subscript: a join of the rows to the slots would
    -- be planned as a nested loop (quadratic) under some statistics.
    owned_by = ($2::text[])[n.ord::int],
    -- The claim's time: the one the limited path took its limits at (its
    -- rate tokens were counted up to it), else the statement's own.
    claimed_at = coalesce($7::timestamptz, statement_timestamp()),
    lease_expires_at = coalesce($7::timestamptz, statement_timestamp()) + least($3::bigint, coalesce(j.timeout_ms, $4::bigint))
                               * interval '1 millisecond',
    updated_at = coalesce($7::timestamptz, statement_timestamp())
FROM numbered n
-- The rows were locked by the scan above (which re-checked their state as it
-- locked them, on their newest version): each is reached again by id (a
-- jobs_pkey lookup per slot, under the nested loop the claim's transaction
-- settles on). A row changed by another transaction after this statement's
-- snapshot is found in the version the snapshot sees, and the update moves
-- on to the newest one, the one this claim holds locked. No state predicate
-- here, so the planner cannot pick the claim index for this join.
WHERE j.id = n.id
RETURNING j.*, n.ord AS slot
