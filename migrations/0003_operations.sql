-- runlease schema, version 3: running it for months. Queue settings, the
-- indexes that listing and pruning walk, and tallies that keep the terminal
-- totals so no request or scrape counts the history.
-- Applies to a database holding version 2 data: nothing is rewritten or
-- dropped; the two indexes are built over the existing rows (writes to jobs
-- wait for the build, which takes as long as a pass over the table).

-- Settings of a queue, kept apart from its jobs: a queue may have settings
-- before its first enqueue. A queue without a row has the defaults (not
-- paused, no limits, the coordinator's retention).
CREATE TABLE queue_settings (
    queue               text             PRIMARY KEY,
    -- A paused queue accepts enqueues and hands out no claims.
    paused              boolean          NOT NULL DEFAULT false,
    -- Flow-control limits (NULL: none).
    max_running         integer,
    max_running_per_key integer,
    rate_per_s          double precision,
    rate_burst          integer,
    -- Retention overrides in ms (NULL: the coordinator's setting; 0: forever).
    retention_done_ms   bigint,
    retention_failed_ms bigint,
    updated_at          timestamptz      NOT NULL DEFAULT now(),

    CONSTRAINT queue_settings_queue_len CHECK (octet_length(queue) BETWEEN 1 AND 128),
    CONSTRAINT queue_settings_max_running_positive CHECK (max_running IS NULL OR max_running >= 1),
    CONSTRAINT queue_settings_max_running_per_key_positive CHECK (
        max_running_per_key IS NULL OR max_running_per_key >= 1),
    -- A rate limit is both figures or neither.
    CONSTRAINT queue_settings_rate_limit CHECK (
        (rate_per_s IS NULL) = (rate_burst IS NULL)
        AND (rate_per_s IS NULL OR (rate_per_s > 0 AND rate_burst >= 1))),
    CONSTRAINT queue_settings_retention_nonnegative CHECK (
        coalesce(retention_done_ms, 0) >= 0 AND coalesce(retention_failed_ms, 0) >= 0)
);

-- Listing (newest first) and bulk actions: one ordered range per (queue,
-- state), so a page costs the same wherever it starts.
CREATE INDEX jobs_list_idx ON jobs (queue, state, id);

-- Pruning: terminal jobs of a (queue, state) by finish time, oldest first.
CREATE INDEX jobs_prune_idx ON jobs (queue, state, finished_at)
    WHERE state IN ('done', 'failed', 'cancelled');

-- Terminal totals per queue, as deltas: a statement that moves jobs into or
-- out of a terminal state (or deletes them) appends one row per (queue,
-- tally) it changed, so concurrent writers never wait on a shared counter
-- row; the prune loop folds the rows into one per (queue, tally). A queue's
-- total is the sum of its rows.
-- Tallies: done, failed, cancelled (jobs in that state now), lease_expiries
-- and retries (attempts so counted, since the tallies began).
CREATE TABLE job_tallies (
    queue text   NOT NULL,
    tally text   NOT NULL,
    n     bigint NOT NULL,
    CONSTRAINT job_tallies_tally CHECK (
        tally IN ('done', 'failed', 'cancelled', 'lease_expiries', 'retries'))
);

-- Jobs that entered a terminal state count +1, jobs that left one -1 (an
-- update that keeps a job terminal counts both and nets to nothing).
CREATE FUNCTION job_tallies_after_update() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_tallies (queue, tally, n)
    SELECT d.queue, d.tally, sum(d.n)::bigint
    FROM (
        SELECT queue, state::text AS tally, 1 AS n FROM new_jobs
        WHERE state IN ('done', 'failed', 'cancelled')
        UNION ALL
        SELECT queue, state::text, -1 FROM old_jobs
        WHERE state IN ('done', 'failed', 'cancelled')
    ) d
    GROUP BY d.queue, d.tally
    HAVING sum(d.n) <> 0;
    RETURN NULL;
END
$$;

CREATE FUNCTION job_tallies_after_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_tallies (queue, tally, n)
    SELECT queue, state::text, -count(*)
    FROM old_jobs
    WHERE state IN ('done', 'failed', 'cancelled')
    GROUP BY queue, state;
    RETURN NULL;
END
$$;

-- Ended attempts: lease expiries, and failed or expired attempts after which
-- the job was queued again (retries). Only those rows look up their job.
CREATE FUNCTION job_tallies_after_attempts() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_tallies (queue, tally, n)
    SELECT j.queue, t.tally, count(*)
    FROM (SELECT job_id, outcome, state_after FROM new_attempts
          WHERE outcome IN ('failed', 'lease_expired')) a
    CROSS JOIN LATERAL (SELECT queue FROM jobs WHERE jobs.id = a.job_id) j
    CROSS JOIN LATERAL (VALUES
        ('lease_expiries', a.outcome = 'lease_expired'),
        ('retries', a.state_after = 'queued')) AS t(tally, counted)
    WHERE t.counted
    GROUP BY j.queue, t.tally;
    RETURN NULL;
END
$$;

-- The triggers lock the tables (SHARE ROW EXCLUSIVE) until this migration
-- commits, so the initial counts below miss no concurrent write.
CREATE TRIGGER jobs_tallies_update AFTER UPDATE ON jobs
    REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_tallies_after_update();
CREATE TRIGGER jobs_tallies_delete AFTER DELETE ON jobs
    REFERENCING OLD TABLE AS old_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION job_tallies_after_delete();
CREATE TRIGGER job_attempts_tallies AFTER INSERT ON job_attempts
    REFERENCING NEW TABLE AS new_attempts
    FOR EACH STATEMENT EXECUTE FUNCTION job_tallies_after_attempts();

-- The totals of the rows already here (one pass, at migration time only).
INSERT INTO job_tallies (queue, tally, n)
SELECT queue, state::text, count(*)
FROM jobs
WHERE state IN ('done', 'failed', 'cancelled')
GROUP BY queue, state;

INSERT INTO job_tallies (queue, tally, n)
SELECT j.queue, t.tally, count(*)
FROM job_attempts a
JOIN jobs j ON j.id = a.job_id
CROSS JOIN LATERAL (VALUES
    ('lease_expiries', a.outcome = 'lease_expired'),
    ('retries', a.outcome IN ('failed', 'lease_expired') AND a.state_after = 'queued'))
    AS t(tally, counted)
WHERE t.counted
GROUP BY j.queue, t.tally;
