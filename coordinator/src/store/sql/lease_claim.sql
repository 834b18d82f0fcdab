-- Claim due jobs of queues $1 for a list of slots: one slot per lease wanted,
-- each naming its worker ($2; one claimer asking for 3 jobs fills 3 slots).
-- A compare-and-set to running that increments run_lease, charges one
-- attempt and sets the lease to now() + TTL, capped at the attempt's timeout.
-- Jobs are handed out in (priority, run_at, id) order to slots in order; each
-- row answers the slot (1-based) it filled, so one statement serves many
-- parked claimers.
-- $1 text[] queues, $2 text[] slot workers, $3 bigint lease TTL ms,
-- $4 bigint default timeout ms, $5 bigint time left ms (NULL: no limit; only
-- jobs whose timeout fits are taken), $6 bool whether queues with flow-control
-- limits are served (true only on the limited path, which holds the queue's
-- settings row locked and passes one queue and the slots its limits allow;
-- false skips them, so a coordinator whose view of the settings is a moment
-- old can never start a job past a limit), $7 timestamptz claim time (NULL:
-- now; the limited path passes the time it took the limits at), $8 int[],
-- $9 timestamptz[], $10 uuid[] the claim floor of each queue of $1, in the
-- same order, as (priority, run_at, id) (NULL arrays, or NULL elements: no
-- floor). A floor is a key no claimable job of its queue sorts below (the
-- coordinator keeps one per queue: store/floors.rs); the scan starts there
-- instead of at the queue's first entry, so it does not walk the entries
-- of jobs claimed since vacuum last ran (they stay in the index until a
-- vacuum may remove them, which an old snapshot can put off for minutes).
-- Index: jobs_claim_idx (queue, priority, run_at, id) WHERE claimable, one
-- ordered scan per queue from its floor (a row comparison on the index's
-- last three columns, an index condition): the cost grows with the slots,
-- not the backlog;
-- queue_settings_pkey for the pause check; jobs_pkey to update the locked
-- rows, one lookup per slot.
-- Plan: the store runs it with its generic plan, planned once per
-- connection instead of at every claim, with hash and merge joins off for
-- the claim's transaction, and sorts and bitmap scans off for the claim
-- itself (sql::CLAIM_SCAN_PLANNING): the per-queue scans are LATERAL
-- ordered scans of jobs_claim_idx whatever the estimates (the floor's row
-- comparison makes a generic plan guess a third of the rows, and with
-- statistics taken while the queue was short, an index on (queue, state)
-- and a sort would look cheaper) and the update a nested loop of jobs_pkey
-- lookups, so no estimate of the parameters or statistics can turn it into
-- a scan of the table or of a queue's history.
-- Locking: FOR UPDATE SKIP LOCKED, so concurrent claims neither wait on nor
-- receive the same row; locking re-checks the state, so a row another claim
-- took meanwhile is skipped.
WITH picked AS (
    -- Per queue, an ordered scan of jobs_claim_idx that stops after the
    -- slots (a plain `queue = ANY($1)` is planned as a scan and sort of every
    -- claimable row). With several queues, rows locked here but beyond the
    -- overall limit are only held until this statement's transaction ends.
    SELECT c.id, c.priority, c.run_at
    FROM unnest($1::text[], $8::int[], $9::timestamptz[], $10::uuid[])
         AS q(queue, floor_priority, floor_run_at, floor_id)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at
        FROM jobs
        WHERE jobs.queue = q.queue
          AND (priority, run_at, id) >= (coalesce(q.floor_priority, -2147483648),
                                         coalesce(q.floor_run_at, '-infinity'),
                                         coalesce(q.floor_id, '00000000-0000-0000-0000-000000000000'))
          AND state IN ('queued', 'enqueue_failed')
          AND run_at <= now()
          AND ($5::bigint IS NULL OR coalesce(timeout_ms, $4::bigint) <= $5::bigint)
          -- A paused queue hands out nothing, and a limited one (an endpoint's
          -- concurrency is a limit) only on the limited path. This names no column of jobs, so it is checked
          -- once per queue before the scan (no row of such a queue is even
          -- locked).
          AND NOT EXISTS (SELECT 1 FROM queue_settings s
                          WHERE s.queue = q.queue
                            AND (s.paused
                                 OR (NOT $6::bool
                                     AND (s.max_running IS NOT NULL
                                          OR s.max_running_per_key IS NOT NULL
                                          OR s.rate_per_s IS NOT NULL
                                          OR s.endpoint_concurrency IS NOT NULL))))
        ORDER BY priority, run_at, id
        LIMIT cardinality($2::text[])
        FOR UPDATE SKIP LOCKED
    ) c
    ORDER BY c.priority, c.run_at, c.id
    LIMIT cardinality($2::text[])
), numbered AS (
    -- The picked rows in hand-out order zipped with the slots: the n-th row
    -- goes to the n-th slot and names its worker. ROWS FROM walks both
    -- lists once, side by side (a join of the rows to the slots could be
    -- planned as a nested loop, quadratic, under some statistics; reading
    -- the worker by subscript, `$2[n]`, walks the text array from its start
    -- for every row, quadratic too). Slots beyond the rows pair with NULL.
    SELECT z.id, z.worker, z.ord
    FROM ROWS FROM (unnest(ARRAY(SELECT id FROM picked ORDER BY priority, run_at, id)),
                    unnest($2::text[])) WITH ORDINALITY AS z(id, worker, ord)
    WHERE z.id IS NOT NULL
)
UPDATE jobs j SET
    state = 'running',
    run_lease = j.run_lease + 1,
    attempt = j.attempt + 1,
    owned_by = n.worker,
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
-- settles on). A row another transaction changed after this statement's
-- snapshot is found in the version the snapshot sees, and the update moves
-- on to its newest version, the one this claim holds locked (reaching it by
-- its ctid instead, a TID scan under the snapshot would see nothing there
-- and leave the slot unfilled). No state predicate here, so the planner
-- cannot pick the claim index for this join.
WHERE j.id = n.id
-- What a lease carries (ClaimedJob), not the whole row.
RETURNING j.id, j.queue, j.run_lease, j.payload, j.attempt, j.progress, j.timeout_ms, j.traceparent,
          j.max_attempts, j.dependencies,
          n.ord AS slot
