-- Claim up to $3 due jobs of queues $1 for worker $2: a compare-and-set to
-- running that increments run_lease, charges one attempt and sets the lease
-- to now() + TTL, capped at the attempt's timeout.
-- $1 text[] queues, $2 text worker_id, $3 bigint limit, $4 bigint lease TTL ms,
-- $5 bigint default timeout ms, $6 bigint time left ms (NULL: no limit; only jobs
-- whose timeout fits are taken).
-- Index: jobs_claim_idx (queue, priority, run_at, id) WHERE claimable.
-- Locking: FOR UPDATE SKIP LOCKED, so concurrent claimers neither wait on nor
-- receive the same row; the UPDATE re-checks the state it selected.
WITH picked AS (
    SELECT id
    FROM jobs
    WHERE queue = ANY($1::text[])
      AND state IN ('queued', 'enqueue_failed')
      AND run_at <= now()
      AND ($6::bigint IS NULL OR coalesce(timeout_ms, $5::bigint) <= $6::bigint)
    ORDER BY priority, run_at, id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE jobs j SET
    state = 'running',
    run_lease = j.run_lease + 1,
    attempt = j.attempt + 1,
    owned_by = $2,
    claimed_at = now(),
    lease_expires_at = now() + least($4::bigint, coalesce(j.timeout_ms, $5::bigint))
                               * interval '1 millisecond',
    updated_at = now()
FROM picked
WHERE j.id = picked.id AND j.state IN ('queued', 'enqueue_failed')
RETURNING j.*
