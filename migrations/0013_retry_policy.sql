-- runlease schema, version 13: retry policies and dead-letter follow-ups.
-- A queue may set a retry policy (attempt budget, backoff, retry window)
-- and a dead-letter queue; a job may set its own policy at enqueue. The
-- enqueue statement copies the queue's policy into each job that does not
-- set its own, so a job runs under the policy of the moment it was
-- enqueued; fields left NULL on the job take the coordinator's defaults
-- when a retry is planned. The chronology says when each retry was
-- planned and why.
--
-- Locking: ALTER TABLE takes ACCESS EXCLUSIVE locks on jobs,
-- job_attempt_log and queue_settings until the migration commits. No new
-- column has a default to write, so no row is rewritten.

-- A job's retry policy, fixed at enqueue (its own, else its queue's):
-- the backoff before each retry is min(max_ms, base_ms * factor^(n - 1))
-- after the n-th attempt, of which the share `jitter` is drawn at random
-- (1: anywhere from 0 to the full delay; 0: the exact delay). A NULL field
-- takes the coordinator's default. retry_window_ms: no retry starts later
-- than that after the first attempt started.
ALTER TABLE jobs ADD COLUMN backoff_base_ms bigint;
ALTER TABLE jobs ADD COLUMN backoff_max_ms bigint;
ALTER TABLE jobs ADD COLUMN backoff_factor double precision;
ALTER TABLE jobs ADD COLUMN backoff_jitter double precision;
ALTER TABLE jobs ADD COLUMN retry_window_ms bigint;
-- When the job's first attempt (since its enqueue or its last admin
-- retry) started. Written when an attempt ends, not by the claim: while
-- the first attempt runs, claimed_at holds the same instant.
ALTER TABLE jobs ADD COLUMN first_claimed_at timestamptz;
-- Why the failure of the attempt recorded on the row ended the job
-- (final_outcome = 'failed'); a retried failure's reason goes to
-- job_attempt_log with the attempt.
ALTER TABLE jobs ADD COLUMN retry_reason text;
ALTER TABLE jobs ADD CONSTRAINT jobs_retry_policy CHECK (
    (backoff_base_ms IS NULL OR backoff_base_ms >= 0)
    AND (backoff_max_ms IS NULL OR backoff_max_ms >= 0)
    AND (backoff_factor IS NULL OR backoff_factor BETWEEN 1 AND 10)
    AND (backoff_jitter IS NULL OR backoff_jitter BETWEEN 0 AND 1)
    AND (retry_window_ms IS NULL OR retry_window_ms >= 1)) NOT VALID;

-- A queue's retry policy (copied into the jobs enqueued on it that set
-- none of their own) and its dead-letter queue: a job of the queue that
-- fails for good enqueues one follow-up there, in the same statement.
ALTER TABLE queue_settings ADD COLUMN max_attempts integer;
ALTER TABLE queue_settings ADD COLUMN backoff_base_ms bigint;
ALTER TABLE queue_settings ADD COLUMN backoff_max_ms bigint;
ALTER TABLE queue_settings ADD COLUMN backoff_factor double precision;
ALTER TABLE queue_settings ADD COLUMN backoff_jitter double precision;
ALTER TABLE queue_settings ADD COLUMN retry_window_ms bigint;
ALTER TABLE queue_settings ADD COLUMN dead_letter_queue text;
ALTER TABLE queue_settings ADD CONSTRAINT queue_settings_retry_policy CHECK (
    (max_attempts IS NULL OR max_attempts >= 1)
    AND (backoff_base_ms IS NULL OR backoff_base_ms >= 0)
    AND (backoff_max_ms IS NULL OR backoff_max_ms >= 0)
    AND (backoff_factor IS NULL OR backoff_factor BETWEEN 1 AND 10)
    AND (backoff_jitter IS NULL OR backoff_jitter BETWEEN 0 AND 1)
    AND (retry_window_ms IS NULL OR retry_window_ms >= 1)
    AND (dead_letter_queue IS NULL
         OR (octet_length(dead_letter_queue) BETWEEN 1 AND 128 AND dead_letter_queue <> queue)));

-- Each failed or expired attempt that queued its job again says when the
-- retry may start and why then; one that ended its job says why it did.
ALTER TABLE job_attempt_log ADD COLUMN retry_at timestamptz;
ALTER TABLE job_attempt_log ADD COLUMN retry_reason text;

CREATE OR REPLACE VIEW job_attempts AS
SELECT job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after,
       retry_at, retry_reason
FROM job_attempt_log
UNION ALL
SELECT id, run_lease, owned_by, claimed_at, finished_at, final_outcome,
       CASE WHEN final_outcome = 'failed' THEN error END, state,
       NULL::timestamptz, CASE WHEN final_outcome = 'failed' THEN retry_reason END
FROM jobs
WHERE final_outcome IS NOT NULL;

CREATE OR REPLACE FUNCTION job_attempts_insert() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after,
                                 retry_at, retry_reason)
    VALUES (NEW.job_id, NEW.run_lease, NEW.worker_id, NEW.claimed_at, NEW.finished_at, NEW.outcome, NEW.error,
            NEW.state_after, NEW.retry_at, NEW.retry_reason);
    RETURN NEW;
END
$$;

-- The share of a delay a retry's jitter takes off, in [0, 1): drawn from
-- a hash of the job and the lease that failed, so every expression of one
-- statement that asks (the job's next state, its run_at, the reason)
-- sees the same draw.
CREATE FUNCTION job_retry_draw(id uuid, run_lease bigint) RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (hashtextextended(id::text, run_lease) & 4503599627370495)::float8 / 4503599627370496
$$;

-- The backoff delay, ms, after a job's `attempt`-th attempt failed, from
-- the job's policy with NULL fields taken from the defaults given (the
-- coordinator's base and cap; factor 2 and full jitter). The exponent
-- stops at 280, where no factor allowed (at most 10) fits a double.
CREATE FUNCTION job_backoff_ms(j jobs, base_default bigint, max_default bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT floor(least(coalesce(j.backoff_max_ms, max_default)::float8,
                       coalesce(j.backoff_base_ms, base_default)
                           * power(coalesce(j.backoff_factor, 2), least(j.attempt - 1, 280)))
                 * (1 - coalesce(j.backoff_jitter, 1) * job_retry_draw(j.id, j.run_lease)))::bigint
$$;

-- When a failed attempt of running job `j` would start again: now() plus
-- the worker's retry_after_ms, else the backoff.
CREATE FUNCTION job_retry_start(j jobs, retry_after_ms bigint, base_default bigint, max_default bigint)
RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT now() + coalesce(retry_after_ms, job_backoff_ms(j, base_default, max_default)) * interval '1 millisecond'
$$;

-- When a failed attempt of running job `j` is retried (job_retry_start);
-- NULL when it is not: not retryable, out of attempts, or a start past the
-- retry window (counted from the start of the first attempt).
CREATE FUNCTION job_retry_at(j jobs, retryable boolean, retry_after_ms bigint, base_default bigint,
                             max_default bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN NOT coalesce(retryable, false) OR j.attempt >= j.max_attempts THEN NULL
                WHEN j.retry_window_ms IS NULL
                     OR job_retry_start(j, retry_after_ms, base_default, max_default)
                        <= coalesce(j.first_claimed_at, j.claimed_at) + j.retry_window_ms * interval '1 millisecond'
                THEN job_retry_start(j, retry_after_ms, base_default, max_default)
           END
$$;

-- Why a failed attempt of running job `j` was retried or ended the job
-- (job_retry_at with the same arguments says when): a code, a colon, and
-- the numbers that decided it.
CREATE FUNCTION job_retry_reason(j jobs, retryable boolean, retry_after_ms bigint, base_default bigint,
                                 max_default bigint) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN NOT coalesce(retryable, false) THEN 'not_retryable: the worker marked the failure not retryable'
        WHEN j.attempt >= j.max_attempts THEN
            format('attempts_exhausted: %s of %s attempts used', j.attempt, j.max_attempts)
        WHEN job_retry_at(j, retryable, retry_after_ms, base_default, max_default) IS NULL THEN
            format('retry_window_ended: a retry in %s ms would start more than %s ms after the first attempt started',
                   coalesce(retry_after_ms, job_backoff_ms(j, base_default, max_default)), j.retry_window_ms)
        WHEN retry_after_ms IS NOT NULL THEN format('retry_after: %s ms, as the worker asked', retry_after_ms)
        ELSE format('backoff: %s ms (attempt %s; base %s ms, factor %s, max %s ms, jitter %s)',
                    job_backoff_ms(j, base_default, max_default), j.attempt,
                    coalesce(j.backoff_base_ms, base_default), coalesce(j.backoff_factor, 2),
                    coalesce(j.backoff_max_ms, max_default), coalesce(j.backoff_jitter, 1))
    END
$$;

-- A UUIDv7 (the form of every job id: time-ordered), for jobs a statement
-- enqueues itself (dead-letter follow-ups).
CREATE FUNCTION job_id_v7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                                          PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                                            FROM 3)
                                          FROM 1 FOR 6),
                                  52, 1),
                          53, 1),
                  'hex')::uuid
$$;
