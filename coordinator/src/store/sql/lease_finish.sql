-- End running attempts, many at once and of every kind, in one statement:
-- each item is a complete, a fail or a release, guarded on its row by
-- (id, state = 'running', run_lease). An attempt that ends its job (done,
-- or failed for good) is recorded on the job row (final_outcome: the row
-- already holds the attempt's lease, worker, times and error), and written
-- to job_attempt_log only if the job is retried later; every other ended
-- attempt (queued again, cancelled) is appended to job_attempt_log here.
--   complete: done (even with a cancel requested), with the result.
--   fail:     cancelled with a cancel requested; queued again after the delay
--             (the worker's retry_after_ms, or the job's backoff) when
--             retryable, with budget left and a start within the job's retry
--             window (job_retry_at); otherwise failed, and, on a queue with
--             a dead-letter queue, followed by one job enqueued there.
--   release:  cancelled with a cancel requested; otherwise queued, claimable
--             at once (or after its retry_after_ms: an endpoint's
--             Retry-After), the attempt's charge given back, the worker's
--             checkpoint (NULL keeps the saved one) kept for the next attempt.
-- $1 uuid[] ids, $2 bigint[] run leases, $3 text[] actions ('complete',
-- 'fail', 'release'), $4 jsonb[] results, $5 text[] errors, $6 bool[]
-- retryable, $7 bigint[] retry_after_ms (a fail's delay, NULL: backoff; a release's, NULL: none), $8 jsonb[] progress
-- (parallel arrays, one element per item; fields an action does not use are
-- NULL), $9 bigint default backoff base ms, $10 bigint default backoff cap
-- ms (for a job whose policy sets none).
-- The store sends the items sorted by (id, run_lease), each pair once (the
-- first item a request batch holds for it): this statement neither sorts
-- nor removes repeats. (Were a pair repeated, the row would still be
-- updated once, by the first.)
-- Tallies: the store counts each row answered (tally::finished): the
-- job's terminal state, and a retry where a fail queued the job again.
-- Answers one row per item that took effect, with what a finish answer needs
-- and what the store's next statements in the same transaction need (see
-- Dependents and Follow-ups below), and for a job queued again its place
-- in the claim order (priority, run_at: the claim floors, store/floors.rs);
-- items absent from the answer are stale or already applied.
-- Index: jobs_pkey, one lookup per item; for a job failed for good,
-- queue_settings_pkey (its queue's dead-letter queue).
-- Locking: the update locks each row as it reaches it, in id order (the
-- items, sorted by id, are joined to jobs_pkey by a nested loop in their
-- order, one lookup per item; the store runs it under the claim's
-- settings, which leave that nested loop its only plan). Heartbeats lock in the same order and claims, the reaper and the
-- pruner skip locked rows, so no interleaving of finishes and heartbeats
-- can deadlock. The guard and the next state are computed on the row the
-- update locked: a row changed meanwhile by a committed statement is
-- checked again as it is now.
-- Dependents: a job this statement ends with `dependents` (a count kept
-- on its row, bumped under the row's lock by each enqueue of a dependent)
-- is answered with it: the store then settles those dependents with the
-- next statement of this transaction (job_dependents_settled.sql), whose
-- snapshot, taken after this statement locked the jobs it ended, sees
-- every dependent enqueued before: the last dependency to end `done`
-- queues its job in the transaction that ends it. Jobs without dependents
-- pay for nothing more.
-- Follow-ups: a job failed for good is answered with its queue's
-- dead-letter queue and what the follow-up's payload needs; where it has
-- one, the store enqueues the follow-up with the next statement of this
-- transaction (job_dead_letter.sql).
WITH input AS (
    SELECT *
    FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::jsonb[], $5::text[],
                $6::boolean[], $7::bigint[], $8::jsonb[])
         AS t(id, run_lease, action, result, error, retryable, retry_after_ms, progress)
), finished AS (
    UPDATE jobs j SET
        -- Every expression reads the row as the update locked it. The
        -- state each action leads to:
        --   queued    a release, or a retryable fail with budget left,
        --             without a cancel request;
        --   cancelled a fail or release with a cancel requested;
        --   done      a complete; failed: any other fail.
        state = CASE WHEN i.action = 'complete' THEN 'done'::job_state
                     WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::job_state
                     WHEN i.action = 'release' THEN 'queued'::job_state
                     WHEN job_retry_at(j, i.retryable, i.retry_after_ms, $9, $10) IS NOT NULL THEN 'queued'::job_state
                     ELSE 'failed'::job_state END,
        result = CASE WHEN i.action = 'complete' THEN i.result ELSE j.result END,
        error = CASE WHEN i.action = 'fail' THEN i.error ELSE j.error END,
        progress = CASE WHEN i.action = 'release' THEN coalesce(i.progress, j.progress) ELSE j.progress END,
        attempt = CASE WHEN i.action = 'release' AND j.cancel_requested_at IS NULL
                       THEN j.attempt - 1 ELSE j.attempt END,
        run_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR i.action = 'complete' THEN j.run_at
                      WHEN i.action = 'release' THEN
                          now() + coalesce(i.retry_after_ms, 0) * interval '1 millisecond'
                      ELSE coalesce(job_retry_at(j, i.retryable, i.retry_after_ms, $9, $10), j.run_at) END,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR i.action = 'complete' THEN now()
                           WHEN i.action = 'release' THEN NULL
                           WHEN job_retry_at(j, i.retryable, i.retry_after_ms, $9, $10) IS NOT NULL THEN NULL
                           ELSE now() END,
        lease_expires_at = NULL,
        final_outcome = CASE WHEN i.action = 'complete' THEN 'completed'::attempt_outcome
                             WHEN j.cancel_requested_at IS NOT NULL OR i.action = 'release' THEN NULL
                             WHEN job_retry_at(j, i.retryable, i.retry_after_ms, $9, $10) IS NOT NULL THEN NULL
                             ELSE 'failed'::attempt_outcome END,
        -- Why a fail was retried or ended the job (the log keeps a
        -- retry's; the row, the reason of a failure for good).
        retry_reason = CASE WHEN i.action = 'fail' AND j.cancel_requested_at IS NULL
                            THEN job_retry_reason(j, i.retryable, i.retry_after_ms, $9, $10) END,
        -- The retry window counts from the first attempt's start.
        first_claimed_at = coalesce(j.first_claimed_at, j.claimed_at),
        updated_at = now()
    FROM input i
    -- The guard, inside a CASE: a bare state predicate would let the
    -- planner reach the rows through a partial index (every running job)
    -- instead of one jobs_pkey lookup per item.
    WHERE j.id = i.id
      AND CASE WHEN j.state = 'running' THEN j.run_lease = i.run_lease ELSE false END
    RETURNING j.id, j.run_lease, j.queue, j.state, j.created_at, j.finished_at,
              j.owned_by, j.claimed_at, i.action, i.error,
              j.traceparent IS NOT NULL AS traced, j.dependents,
              j.run_at, j.priority, j.retry_reason, j.attempt,
              -- A job failed for good: what its follow-up needs (nothing
              -- is copied for the others), its queue's dead-letter queue (a
              -- queue_settings_pkey lookup) and the id of its follow-up.
              CASE WHEN j.state = 'failed' THEN j.payload END AS payload,
              CASE WHEN j.state = 'failed' THEN j.traceparent END AS traceparent,
              CASE WHEN j.state = 'failed'
                   THEN (SELECT s.dead_letter_queue FROM queue_settings s WHERE s.queue = j.queue) END
                  AS dead_letter_queue,
              CASE WHEN j.state = 'failed' THEN job_id_v7() END AS dead_letter_id
), recorded AS (
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after,
                                 retry_at, retry_reason)
    SELECT id, run_lease, owned_by, claimed_at, now(),
           CASE WHEN state = 'cancelled' AND action <> 'complete' THEN 'cancelled'::attempt_outcome
                WHEN action = 'complete' THEN 'completed'::attempt_outcome
                WHEN action = 'fail' THEN 'failed'::attempt_outcome
                ELSE 'released'::attempt_outcome END,
           CASE WHEN action = 'fail' THEN error END,
           state,
           CASE WHEN action = 'fail' AND state = 'queued' THEN run_at END,
           retry_reason
    FROM finished
    WHERE state NOT IN ('done', 'failed')
)
SELECT id, run_lease, action, queue, state, created_at, finished_at, traced, dependents,
       error, attempt, payload, traceparent, dead_letter_queue, priority, run_at,
       CASE WHEN dead_letter_queue IS NOT NULL THEN dead_letter_id END AS dead_letter_id
FROM finished
