-- runlease schema, version 4: flow control. A job may name a concurrency
-- key (one tenant, one customer) that a queue's max_running_per_key limits;
-- a queue's rate limit keeps its token bucket on its settings row; cron
-- schedules enqueue jobs.

-- The column is new, so every row holds NULL and satisfies the check: NOT
-- VALID spares a pass over the table (new and updated rows are checked).
-- Note: adding a column locks jobs until this migration commits, and the
-- two partial indexes below are built in it (a pass over the table each,
-- short, as no existing row has a key): writes to jobs wait meanwhile.
ALTER TABLE jobs ADD COLUMN concurrency_key text;
ALTER TABLE jobs ADD CONSTRAINT jobs_concurrency_key_len CHECK (
    concurrency_key IS NULL OR octet_length(concurrency_key) BETWEEN 1 AND 255) NOT VALID;

-- Claims of a queue limited per key: the claimable jobs of each key in
-- hand-out order, so a key at its limit is skipped with one index probe
-- instead of a walk over its jobs. Jobs without a key never enter it (nor
-- the next index): queues that do not use keys pay nothing for them.
CREATE INDEX jobs_claim_key_idx ON jobs (queue, concurrency_key, priority, run_at, id)
    WHERE state IN ('queued', 'enqueue_failed') AND concurrency_key IS NOT NULL;

-- Counting what runs per key (max_running_per_key). What runs per queue
-- (max_running) is counted through jobs_list_idx (queue, state, id).
CREATE INDEX jobs_running_key_idx ON jobs (queue, concurrency_key)
    WHERE state = 'running' AND concurrency_key IS NOT NULL;

-- The token bucket of a rate limit: tokens left at rate_refilled_at.
ALTER TABLE queue_settings ADD COLUMN rate_tokens double precision;
ALTER TABLE queue_settings ADD COLUMN rate_refilled_at timestamptz;

-- Cron schedules: each fire time enqueues one job (idempotency key
-- schedule:<name>:<fire time>).
CREATE TABLE schedules (
    name          text        PRIMARY KEY,
    queue         text        NOT NULL,
    cron          text        NOT NULL,
    timezone      text        NOT NULL DEFAULT 'UTC',
    payload       jsonb       NOT NULL,
    priority      integer     NOT NULL DEFAULT 0,
    max_attempts  integer,
    timeout_ms    bigint,
    paused        boolean     NOT NULL DEFAULT false,
    -- The next fire time not yet enqueued.
    next_fire_at  timestamptz NOT NULL,
    last_fired_at timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),

    CONSTRAINT schedules_name_len CHECK (octet_length(name) BETWEEN 1 AND 128),
    CONSTRAINT schedules_queue_len CHECK (octet_length(queue) BETWEEN 1 AND 128),
    CONSTRAINT schedules_max_attempts_positive CHECK (max_attempts IS NULL OR max_attempts >= 1),
    CONSTRAINT schedules_timeout_positive CHECK (timeout_ms IS NULL OR timeout_ms > 0)
);

-- The schedule loop: unpaused schedules by next fire time.
CREATE INDEX schedules_due_idx ON schedules (next_fire_at) WHERE NOT paused;
