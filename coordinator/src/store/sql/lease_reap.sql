-- Reap up to $1 expired leases: with a cancel requested the job becomes
-- cancelled; with budget left and its retry window still open it is queued
-- again, claimable at once (the expiry was the wait: no backoff); otherwise
-- failed, and, on a queue with a dead-letter queue, followed by one job
-- enqueued there (as lease_finish.sql does). The expired attempt is charged
-- and appended to job_attempt_log as lease_expired, with when the retry
-- may start and why (or why there is none).
-- Each write is guarded on the run_lease the reaper read and on the expiry
-- itself, so a lease renewed a moment ago is never reaped.
-- Tallies: the store counts each row answered (tally::reaped): the job's
-- terminal state, and the attempt written: a lease expiry, and a retry
-- where the job is queued again. A dead-letter follow-up is queued: no tally.
-- $1 bigint limit, $2 bigint default timeout ms (to tell a timeout from a
-- lapse), $3 int default attempt budget (of a dead-letter follow-up).
-- Answers the reaped jobs' rows, each with the follow-up it enqueued, if any.
-- Index: jobs_running_idx (queue, id) WHERE running: a pass over the running
-- jobs (their rows are read for the expiry, which no index keys: a
-- heartbeat then changes no indexed column). Its cost follows the jobs
-- running, never the history; the pass stops at $1 expired ones.
-- Locking: FOR UPDATE SKIP LOCKED: reapers on several coordinators split the
-- expired rows between them and never reap one lease twice.
WITH expired AS (
    SELECT id, run_lease
    FROM jobs
    WHERE state = 'running' AND lease_expires_at <= now()
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), reaped AS (
    UPDATE jobs j SET
        state = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::job_state
                     WHEN j.attempt < j.max_attempts
                          AND (j.retry_window_ms IS NULL
                               OR now() <= coalesce(j.first_claimed_at, j.claimed_at)
                                           + j.retry_window_ms * interval '1 millisecond')
                     THEN 'queued'::job_state
                     ELSE 'failed'::job_state END,
        error = CASE WHEN j.lease_expires_at >= j.claimed_at + coalesce(j.timeout_ms, $2::bigint) * interval '1 millisecond'
                     THEN 'attempt exceeded its timeout'
                     ELSE 'lease expired: no heartbeat within the lease TTL' END,
        run_at = now(),
        lease_expires_at = NULL,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempt >= j.max_attempts
                                OR now() > coalesce(j.first_claimed_at, j.claimed_at)
                                           + j.retry_window_ms * interval '1 millisecond'
                           THEN now() END,
        retry_reason = CASE WHEN j.cancel_requested_at IS NOT NULL THEN NULL
                            WHEN j.attempt >= j.max_attempts THEN
                                format('attempts_exhausted: %s of %s attempts used', j.attempt, j.max_attempts)
                            WHEN now() > coalesce(j.first_claimed_at, j.claimed_at)
                                         + j.retry_window_ms * interval '1 millisecond' THEN
                                format('retry_window_ended: a retry now would start more than %s ms after the first attempt started',
                                       j.retry_window_ms)
                            ELSE 'lease_expired: claimable again at once' END,
        first_claimed_at = coalesce(j.first_claimed_at, j.claimed_at),
        updated_at = now()
    FROM expired e
    WHERE j.id = e.id AND j.state = 'running' AND j.run_lease = e.run_lease
      AND j.lease_expires_at <= now()
    RETURNING j.*
), recorded AS (
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after,
                                 retry_at, retry_reason)
    SELECT id, run_lease, owned_by, claimed_at, now(), 'lease_expired', error, state,
           CASE WHEN state = 'queued' THEN run_at END, retry_reason
    FROM reaped
), dead_lettered AS (
    -- As job_dead_letter.sql does after a finish: one follow-up per job
    -- failed for good, keyed by the lease that failed.
    INSERT INTO jobs (id, queue, payload, max_attempts, idempotency_key, traceparent,
                      backoff_base_ms, backoff_max_ms, backoff_factor, backoff_jitter, retry_window_ms)
    SELECT job_id_v7(), s.dead_letter_queue,
           jsonb_build_object('job_id', r.id, 'queue', r.queue, 'payload', r.payload,
                              'error', r.error, 'attempts', r.attempt),
           coalesce(d.max_attempts, $3::int), 'dead-letter:' || r.id || ':' || r.run_lease, r.traceparent,
           d.backoff_base_ms, d.backoff_max_ms, d.backoff_factor, d.backoff_jitter, d.retry_window_ms
    FROM reaped r
    JOIN queue_settings s ON s.queue = r.queue
    LEFT JOIN queue_settings d ON d.queue = s.dead_letter_queue
    WHERE r.state = 'failed' AND s.dead_letter_queue IS NOT NULL
    ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, queue, (payload ->> 'job_id')::uuid AS failed_id
)
SELECT r.*, d.id AS dead_letter_id, d.queue AS dead_letter_queue
FROM reaped r
LEFT JOIN dead_lettered d ON d.failed_id = r.id
