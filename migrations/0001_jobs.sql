-- runlease schema, version 1: jobs and their append-only attempt chronology.
-- Applied in one transaction under an advisory lock (coordinator/src/store/migrate.rs).

CREATE TYPE job_state AS ENUM (
    'queued', 'running', 'done', 'failed', 'cancelled', 'enqueue_failed'
);

CREATE TYPE attempt_outcome AS ENUM (
    'completed', 'failed', 'released', 'lease_expired', 'cancelled'
);

CREATE TABLE jobs (
    id                  uuid        PRIMARY KEY,
    queue               text        NOT NULL,
    state               job_state   NOT NULL DEFAULT 'queued',
    payload             jsonb       NOT NULL,
    result              jsonb,
    error               text,
    priority            integer     NOT NULL DEFAULT 0,
    run_at              timestamptz NOT NULL DEFAULT now(),
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- The latest claim; kept after the attempt ends, for the record.
    claimed_at          timestamptz,
    owned_by            text,
    -- The fencing counter: every claim increments it, nothing lowers it.
    run_lease           bigint      NOT NULL DEFAULT 0,
    -- Attempts charged; a release gives its charge back, an admin retry resets it.
    attempt             integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL,
    timeout_ms          bigint,
    lease_expires_at    timestamptz,
    progress            jsonb,
    idempotency_key     text,
    cancel_requested_at timestamptz,
    finished_at         timestamptz,

    CONSTRAINT jobs_queue_len CHECK (octet_length(queue) BETWEEN 1 AND 128),
    CONSTRAINT jobs_run_lease_nonnegative CHECK (run_lease >= 0),
    CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts >= 1),
    CONSTRAINT jobs_attempt_in_budget CHECK (attempt BETWEEN 0 AND max_attempts),
    CONSTRAINT jobs_timeout_positive CHECK (timeout_ms IS NULL OR timeout_ms > 0),
    CONSTRAINT jobs_idempotency_key_len CHECK (
        idempotency_key IS NULL OR octet_length(idempotency_key) BETWEEN 1 AND 255),
    -- A running job has an owner, a claim time, a lease and a charged attempt;
    -- no other job has a live lease.
    CONSTRAINT jobs_running_has_lease CHECK (
        (state = 'running') = (lease_expires_at IS NOT NULL)
        AND (state <> 'running'
             OR (owned_by IS NOT NULL AND claimed_at IS NOT NULL
                 AND run_lease >= 1 AND attempt >= 1))),
    -- A claimable job has budget left for the claim to charge.
    CONSTRAINT jobs_claimable_has_budget CHECK (
        state NOT IN ('queued', 'enqueue_failed') OR attempt < max_attempts),
    -- Terminal states, and only they, carry a finish time.
    CONSTRAINT jobs_terminal_has_finished_at CHECK (
        (state IN ('done', 'failed', 'cancelled')) = (finished_at IS NOT NULL)),
    CONSTRAINT jobs_done_has_result CHECK (state <> 'done' OR result IS NOT NULL),
    -- A cancel request is only recorded against a job that was running.
    CONSTRAINT jobs_cancel_request_when_running CHECK (
        cancel_requested_at IS NULL OR state NOT IN ('queued', 'enqueue_failed'))
);

-- Claiming: the due, claimable jobs of a queue in hand-out order.
CREATE INDEX jobs_claim_idx ON jobs (queue, priority, run_at, id)
    WHERE state IN ('queued', 'enqueue_failed');

-- Reaping: running jobs by lease expiry.
CREATE INDEX jobs_reap_idx ON jobs (lease_expires_at)
    WHERE state = 'running';

-- The repair loop: jobs whose wake-up signal was not delivered.
CREATE INDEX jobs_enqueue_failed_idx ON jobs (created_at)
    WHERE state = 'enqueue_failed';

-- Idempotent enqueue: one job per (queue, key).
CREATE UNIQUE INDEX jobs_idempotency_key_uniq ON jobs (queue, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- One row per run lease, written once, when the attempt ends.
CREATE TABLE job_attempts (
    job_id      uuid            NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    run_lease   bigint          NOT NULL,
    worker_id   text            NOT NULL,
    claimed_at  timestamptz     NOT NULL,
    finished_at timestamptz     NOT NULL,
    outcome     attempt_outcome NOT NULL,
    error       text,
    -- Where the attempt left the job: queued (retried or released) or terminal.
    state_after job_state       NOT NULL,
    PRIMARY KEY (job_id, run_lease),
    CONSTRAINT job_attempts_state_after CHECK (state_after IN ('queued', 'done', 'failed', 'cancelled'))
);
