-- runlease: the schema after every migration in this directory, as
-- `pg_dump --schema-only --no-owner --no-privileges` prints it (version
-- lines and session settings left out). Generated: do not edit. The
-- migrations are the source; a test (tests/tests/e2e/schema_snapshot.rs)
-- fails when this file and a freshly migrated database disagree, and
-- RUNLEASE_WRITE_SCHEMA=1 with that test writes it again.
-- Name: attempt_budget; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.attempt_budget AS integer;

-- Name: attempt_outcome; Type: TYPE; Schema: public; Owner: -

CREATE TYPE public.attempt_outcome AS ENUM (
    'completed',
    'failed',
    'released',
    'lease_expired',
    'cancelled'
);

-- Name: backoff_factor; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.backoff_factor AS double precision;

-- Name: backoff_jitter; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.backoff_jitter AS double precision;

-- Name: backoff_ms; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.backoff_ms AS bigint;

-- Name: dependency_count; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.dependency_count AS integer;

-- Name: dependency_failure; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.dependency_failure AS text;

-- Name: job_count; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.job_count AS integer;

-- Name: job_state; Type: TYPE; Schema: public; Owner: -

CREATE TYPE public.job_state AS ENUM (
    'queued',
    'running',
    'done',
    'failed',
    'cancelled',
    'enqueue_failed',
    'blocked'
);

-- Name: lease_timeout_ms; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.lease_timeout_ms AS bigint;

-- Name: retry_window_ms; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.retry_window_ms AS bigint;

-- Name: trace_context; Type: DOMAIN; Schema: public; Owner: -

CREATE DOMAIN public.trace_context AS text;

-- Name: job_attempts_insert(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_attempts_insert() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO job_attempt_log (job_id, run_lease, worker_id, claimed_at, finished_at, outcome, error, state_after,
                                 retry_at, retry_reason)
    VALUES (NEW.job_id, NEW.run_lease, NEW.worker_id, NEW.claimed_at, NEW.finished_at, NEW.outcome, NEW.error,
            NEW.state_after, NEW.retry_at, NEW.retry_reason);
    RETURN NEW;
END
$$;

-- Name: job_attempts_request_sweep(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_attempts_request_sweep() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO job_attempt_sweeps DEFAULT VALUES;
    RETURN NULL;
END
$$;

-- Name: jobs; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.jobs (
    id uuid NOT NULL,
    queue text NOT NULL,
    state public.job_state DEFAULT 'queued'::public.job_state NOT NULL,
    payload jsonb NOT NULL,
    result jsonb,
    error text,
    priority integer DEFAULT 0 NOT NULL,
    run_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    claimed_at timestamp with time zone,
    owned_by text,
    run_lease bigint DEFAULT 0 NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    max_attempts public.attempt_budget NOT NULL,
    timeout_ms public.lease_timeout_ms,
    lease_expires_at timestamp with time zone,
    progress jsonb,
    idempotency_key text,
    cancel_requested_at timestamp with time zone,
    finished_at timestamp with time zone,
    dispatched_run_at timestamp with time zone,
    concurrency_key text,
    traceparent public.trace_context,
    final_outcome public.attempt_outcome,
    dependencies public.dependency_count DEFAULT 0 NOT NULL,
    dependencies_pending public.job_count DEFAULT 0 NOT NULL,
    dependents public.job_count DEFAULT 0 NOT NULL,
    on_dependency_failure public.dependency_failure,
    backoff_base_ms public.backoff_ms,
    backoff_max_ms public.backoff_ms,
    backoff_factor public.backoff_factor,
    backoff_jitter public.backoff_jitter,
    retry_window_ms public.retry_window_ms,
    first_claimed_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT jobs_cancel_request_when_running CHECK (((cancel_requested_at IS NULL) OR (state <> ALL (ARRAY['queued'::public.job_state, 'enqueue_failed'::public.job_state])))),
    CONSTRAINT jobs_done_has_result CHECK (((state <> 'done'::public.job_state) OR (result IS NOT NULL))),
    CONSTRAINT jobs_idempotency_key_len CHECK (((idempotency_key IS NULL) OR ((octet_length(idempotency_key) >= 1) AND (octet_length(idempotency_key) <= 255)))),
    CONSTRAINT jobs_queue_len CHECK (((octet_length(queue) >= 1) AND (octet_length(queue) <= 128))),
    CONSTRAINT jobs_run_lease_nonnegative CHECK ((run_lease >= 0)),
    CONSTRAINT jobs_running_has_lease CHECK ((((state = 'running'::public.job_state) = (lease_expires_at IS NOT NULL)) AND ((state <> 'running'::public.job_state) OR ((owned_by IS NOT NULL) AND (claimed_at IS NOT NULL) AND (run_lease >= 1) AND (attempt >= 1))))),
    CONSTRAINT jobs_terminal_has_finished_at CHECK (((state = ANY (ARRAY['done'::public.job_state, 'failed'::public.job_state, 'cancelled'::public.job_state])) = (finished_at IS NOT NULL)))
)
WITH (fillfactor='90');

-- Name: job_backoff_ms(public.jobs, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_backoff_ms(j public.jobs, base_default bigint, max_default bigint) RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT floor(least(coalesce(j.backoff_max_ms, max_default)::float8,
                       coalesce(j.backoff_base_ms, base_default)
                           * power(coalesce(j.backoff_factor, 2), least(j.attempt - 1, 280)))
                 * (1 - coalesce(j.backoff_jitter, 1) * job_retry_draw(j.id, j.run_lease)))::bigint
$$;

-- Name: job_id_v7(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_id_v7() RETURNS uuid
    LANGUAGE sql PARALLEL SAFE
    AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
                                          PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                                            FROM 3)
                                          FROM 1 FOR 6),
                                  52, 1),
                          53, 1),
                  'hex')::uuid
$$;

-- Name: job_retry_at(public.jobs, boolean, bigint, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_retry_at(j public.jobs, retryable boolean, retry_after_ms bigint, base_default bigint, max_default bigint) RETURNS timestamp with time zone
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT CASE WHEN NOT coalesce(retryable, false) OR j.attempt >= j.max_attempts THEN NULL
                WHEN j.retry_window_ms IS NULL
                     OR job_retry_start(j, retry_after_ms, base_default, max_default)
                        <= coalesce(j.first_claimed_at, j.claimed_at) + j.retry_window_ms * interval '1 millisecond'
                THEN job_retry_start(j, retry_after_ms, base_default, max_default)
           END
$$;

-- Name: job_retry_draw(uuid, bigint); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_retry_draw(id uuid, run_lease bigint) RETURNS double precision
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT (hashtextextended(id::text, run_lease) & 4503599627370495)::float8 / 4503599627370496
$$;

-- Name: job_retry_reason(public.jobs, boolean, bigint, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_retry_reason(j public.jobs, retryable boolean, retry_after_ms bigint, base_default bigint, max_default bigint) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
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

-- Name: job_retry_start(public.jobs, bigint, bigint, bigint); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_retry_start(j public.jobs, retry_after_ms bigint, base_default bigint, max_default bigint) RETURNS timestamp with time zone
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT now() + coalesce(retry_after_ms, job_backoff_ms(j, base_default, max_default)) * interval '1 millisecond'
$$;

-- Name: job_tallies_after_attempts(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_tallies_after_attempts() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

-- Name: job_tallies_request_recount(); Type: FUNCTION; Schema: public; Owner: -

CREATE FUNCTION public.job_tallies_request_recount() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    INSERT INTO job_tally_recounts DEFAULT VALUES;
    RETURN NULL;
END
$$;

-- Name: job_attempt_log; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.job_attempt_log (
    job_id uuid NOT NULL,
    run_lease bigint NOT NULL,
    worker_id text NOT NULL,
    claimed_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone NOT NULL,
    outcome public.attempt_outcome NOT NULL,
    error text,
    state_after public.job_state NOT NULL,
    retry_at timestamp with time zone,
    retry_reason text,
    CONSTRAINT job_attempts_state_after CHECK ((state_after = ANY (ARRAY['queued'::public.job_state, 'done'::public.job_state, 'failed'::public.job_state, 'cancelled'::public.job_state])))
);

-- Name: job_attempt_sweeps; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.job_attempt_sweeps (
    requested_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: job_attempts; Type: VIEW; Schema: public; Owner: -

CREATE VIEW public.job_attempts AS
 SELECT job_attempt_log.job_id,
    job_attempt_log.run_lease,
    job_attempt_log.worker_id,
    job_attempt_log.claimed_at,
    job_attempt_log.finished_at,
    job_attempt_log.outcome,
    job_attempt_log.error,
    job_attempt_log.state_after,
    job_attempt_log.retry_at,
    job_attempt_log.retry_reason
   FROM public.job_attempt_log
UNION ALL
 SELECT jobs.id AS job_id,
    jobs.run_lease,
    jobs.owned_by AS worker_id,
    jobs.claimed_at,
    jobs.finished_at,
    jobs.final_outcome AS outcome,
        CASE
            WHEN (jobs.final_outcome = 'failed'::public.attempt_outcome) THEN jobs.error
            ELSE NULL::text
        END AS error,
    jobs.state AS state_after,
    NULL::timestamp with time zone AS retry_at,
        CASE
            WHEN (jobs.final_outcome = 'failed'::public.attempt_outcome) THEN jobs.retry_reason
            ELSE NULL::text
        END AS retry_reason
   FROM public.jobs
  WHERE (jobs.final_outcome IS NOT NULL);

-- Name: job_dependencies; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.job_dependencies (
    job_id uuid NOT NULL,
    depends_on_id uuid NOT NULL,
    settled boolean DEFAULT false NOT NULL
)
WITH (fillfactor='50');

-- Name: job_tallies; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.job_tallies (
    queue text NOT NULL,
    tally text NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT job_tallies_tally CHECK ((tally = ANY (ARRAY['done'::text, 'failed'::text, 'cancelled'::text, 'lease_expiries'::text, 'retries'::text])))
);

-- Name: job_tally_recounts; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.job_tally_recounts (
    requested_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: queue_settings; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.queue_settings (
    queue text NOT NULL,
    paused boolean DEFAULT false NOT NULL,
    max_running integer,
    max_running_per_key integer,
    rate_per_s double precision,
    rate_burst integer,
    retention_done_ms bigint,
    retention_failed_ms bigint,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    rate_tokens double precision,
    rate_refilled_at timestamp with time zone,
    endpoint_url text,
    endpoint_timeout_ms integer,
    endpoint_concurrency integer,
    endpoint_secret text,
    endpoint_secret_previous text,
    endpoint_secret_previous_until timestamp with time zone,
    endpoint_failures integer DEFAULT 0 NOT NULL,
    endpoint_last_error text,
    endpoint_last_error_at timestamp with time zone,
    max_attempts integer,
    backoff_base_ms bigint,
    backoff_max_ms bigint,
    backoff_factor double precision,
    backoff_jitter double precision,
    retry_window_ms bigint,
    dead_letter_queue text,
    CONSTRAINT queue_settings_endpoint CHECK ((((endpoint_url IS NULL) = (endpoint_timeout_ms IS NULL)) AND ((endpoint_url IS NULL) = (endpoint_concurrency IS NULL)) AND ((endpoint_url IS NULL) OR ((octet_length(endpoint_url) >= 1) AND (octet_length(endpoint_url) <= 2048))) AND ((endpoint_timeout_ms IS NULL) OR ((endpoint_timeout_ms >= 1000) AND (endpoint_timeout_ms <= 900000))) AND ((endpoint_concurrency IS NULL) OR ((endpoint_concurrency >= 1) AND (endpoint_concurrency <= 1000))))),
    CONSTRAINT queue_settings_endpoint_secret CHECK ((((endpoint_secret_previous IS NULL) = (endpoint_secret_previous_until IS NULL)) AND ((endpoint_secret_previous IS NULL) OR (endpoint_secret IS NOT NULL)))),
    CONSTRAINT queue_settings_max_running_per_key_positive CHECK (((max_running_per_key IS NULL) OR (max_running_per_key >= 1))),
    CONSTRAINT queue_settings_max_running_positive CHECK (((max_running IS NULL) OR (max_running >= 1))),
    CONSTRAINT queue_settings_queue_len CHECK (((octet_length(queue) >= 1) AND (octet_length(queue) <= 128))),
    CONSTRAINT queue_settings_rate_limit CHECK ((((rate_per_s IS NULL) = (rate_burst IS NULL)) AND ((rate_per_s IS NULL) OR ((rate_per_s > (0)::double precision) AND (rate_burst >= 1))))),
    CONSTRAINT queue_settings_retention_nonnegative CHECK (((COALESCE(retention_done_ms, (0)::bigint) >= 0) AND (COALESCE(retention_failed_ms, (0)::bigint) >= 0))),
    CONSTRAINT queue_settings_retry_policy CHECK ((((max_attempts IS NULL) OR (max_attempts >= 1)) AND ((backoff_base_ms IS NULL) OR (backoff_base_ms >= 0)) AND ((backoff_max_ms IS NULL) OR (backoff_max_ms >= 0)) AND ((backoff_factor IS NULL) OR ((backoff_factor >= (1)::double precision) AND (backoff_factor <= (10)::double precision))) AND ((backoff_jitter IS NULL) OR ((backoff_jitter >= (0)::double precision) AND (backoff_jitter <= (1)::double precision))) AND ((retry_window_ms IS NULL) OR (retry_window_ms >= 1)) AND ((dead_letter_queue IS NULL) OR (((octet_length(dead_letter_queue) >= 1) AND (octet_length(dead_letter_queue) <= 128)) AND (dead_letter_queue <> queue)))))
);

-- Name: runlease_migrations; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.runlease_migrations (
    version integer NOT NULL,
    name text NOT NULL,
    checksum text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

-- Name: schedules; Type: TABLE; Schema: public; Owner: -

CREATE TABLE public.schedules (
    name text NOT NULL,
    queue text NOT NULL,
    cron text NOT NULL,
    timezone text DEFAULT 'UTC'::text NOT NULL,
    payload jsonb NOT NULL,
    priority integer DEFAULT 0 NOT NULL,
    max_attempts integer,
    timeout_ms bigint,
    paused boolean DEFAULT false NOT NULL,
    next_fire_at timestamp with time zone NOT NULL,
    last_fired_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT schedules_max_attempts_positive CHECK (((max_attempts IS NULL) OR (max_attempts >= 1))),
    CONSTRAINT schedules_name_len CHECK (((octet_length(name) >= 1) AND (octet_length(name) <= 128))),
    CONSTRAINT schedules_queue_len CHECK (((octet_length(queue) >= 1) AND (octet_length(queue) <= 128))),
    CONSTRAINT schedules_timeout_positive CHECK (((timeout_ms IS NULL) OR (timeout_ms > 0)))
);

-- Name: attempt_budget attempt_budget_positive; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.attempt_budget
    ADD CONSTRAINT attempt_budget_positive CHECK ((VALUE >= 1)) NOT VALID;

-- Name: backoff_factor backoff_factor_range; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.backoff_factor
    ADD CONSTRAINT backoff_factor_range CHECK (((VALUE >= (1)::double precision) AND (VALUE <= (10)::double precision))) NOT VALID;

-- Name: backoff_jitter backoff_jitter_range; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.backoff_jitter
    ADD CONSTRAINT backoff_jitter_range CHECK (((VALUE >= (0)::double precision) AND (VALUE <= (1)::double precision))) NOT VALID;

-- Name: backoff_ms backoff_ms_nonnegative; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.backoff_ms
    ADD CONSTRAINT backoff_ms_nonnegative CHECK ((VALUE >= 0)) NOT VALID;

-- Name: dependency_count dependency_count_range; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.dependency_count
    ADD CONSTRAINT dependency_count_range CHECK (((VALUE >= 0) AND (VALUE <= 100))) NOT VALID;

-- Name: dependency_failure dependency_failure_action; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.dependency_failure
    ADD CONSTRAINT dependency_failure_action CHECK ((VALUE = ANY (ARRAY['cancel'::text, 'run'::text]))) NOT VALID;

-- Name: job_attempt_log job_attempt_log_pkey; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.job_attempt_log
    ADD CONSTRAINT job_attempt_log_pkey PRIMARY KEY (job_id, run_lease);

-- Name: job_count job_count_nonnegative; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.job_count
    ADD CONSTRAINT job_count_nonnegative CHECK ((VALUE >= 0)) NOT VALID;

-- Name: job_dependencies job_dependencies_pkey; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.job_dependencies
    ADD CONSTRAINT job_dependencies_pkey PRIMARY KEY (job_id, depends_on_id);

-- Name: jobs jobs_attempt_in_budget; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE public.jobs
    ADD CONSTRAINT jobs_attempt_in_budget CHECK (((attempt >= 0) AND (attempt <= (max_attempts)::integer))) NOT VALID;

-- Name: jobs jobs_claimable_has_budget; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE public.jobs
    ADD CONSTRAINT jobs_claimable_has_budget CHECK (((state <> ALL (ARRAY['queued'::public.job_state, 'enqueue_failed'::public.job_state])) OR (attempt < (max_attempts)::integer))) NOT VALID;

-- Name: jobs jobs_concurrency_key_len; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE public.jobs
    ADD CONSTRAINT jobs_concurrency_key_len CHECK (((concurrency_key IS NULL) OR ((octet_length(concurrency_key) >= 1) AND (octet_length(concurrency_key) <= 255)))) NOT VALID;

-- Name: jobs jobs_dependencies; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE public.jobs
    ADD CONSTRAINT jobs_dependencies CHECK ((((dependencies_pending)::integer <= (dependencies)::integer) AND ((on_dependency_failure IS NULL) = ((dependencies)::integer = 0)) AND (((state)::text = 'blocked'::text) = ((dependencies_pending)::integer > 0)))) NOT VALID;

-- Name: jobs jobs_final_outcome_terminal; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER TABLE public.jobs
    ADD CONSTRAINT jobs_final_outcome_terminal CHECK (((final_outcome IS NULL) OR ((state = 'done'::public.job_state) AND (final_outcome = 'completed'::public.attempt_outcome)) OR ((state = 'failed'::public.job_state) AND (final_outcome = 'failed'::public.attempt_outcome)))) NOT VALID;

-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

-- Name: lease_timeout_ms lease_timeout_ms_positive; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.lease_timeout_ms
    ADD CONSTRAINT lease_timeout_ms_positive CHECK ((VALUE > 0)) NOT VALID;

-- Name: queue_settings queue_settings_pkey; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.queue_settings
    ADD CONSTRAINT queue_settings_pkey PRIMARY KEY (queue);

-- Name: retry_window_ms retry_window_ms_positive; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.retry_window_ms
    ADD CONSTRAINT retry_window_ms_positive CHECK ((VALUE >= 1)) NOT VALID;

-- Name: runlease_migrations runlease_migrations_pkey; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.runlease_migrations
    ADD CONSTRAINT runlease_migrations_pkey PRIMARY KEY (version);

-- Name: schedules schedules_pkey; Type: CONSTRAINT; Schema: public; Owner: -

ALTER TABLE ONLY public.schedules
    ADD CONSTRAINT schedules_pkey PRIMARY KEY (name);

-- Name: trace_context trace_context_form; Type: CHECK CONSTRAINT; Schema: public; Owner: -

ALTER DOMAIN public.trace_context
    ADD CONSTRAINT trace_context_form CHECK ((VALUE ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'::text)) NOT VALID;

-- Name: job_dependencies_depends_on_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX job_dependencies_depends_on_idx ON public.job_dependencies USING btree (depends_on_id, job_id);

-- Name: jobs_blocked_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_blocked_idx ON public.jobs USING btree (queue) WHERE (state > 'enqueue_failed'::public.job_state);

-- Name: jobs_claim_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_claim_idx ON public.jobs USING btree (queue, priority, run_at, id) WHERE (state = ANY (ARRAY['queued'::public.job_state, 'enqueue_failed'::public.job_state]));

-- Name: jobs_claim_key_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_claim_key_idx ON public.jobs USING btree (queue, concurrency_key, priority, run_at, id) WHERE ((state = ANY (ARRAY['queued'::public.job_state, 'enqueue_failed'::public.job_state])) AND (concurrency_key IS NOT NULL));

-- Name: jobs_dispatch_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_dispatch_idx ON public.jobs USING btree (queue, run_at) WHERE ((state = ANY (ARRAY['queued'::public.job_state, 'enqueue_failed'::public.job_state])) AND (dispatched_run_at IS DISTINCT FROM run_at));

-- Name: jobs_enqueue_failed_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_enqueue_failed_idx ON public.jobs USING btree (created_at) WHERE (state = 'enqueue_failed'::public.job_state);

-- Name: jobs_idempotency_key_uniq; Type: INDEX; Schema: public; Owner: -

CREATE UNIQUE INDEX jobs_idempotency_key_uniq ON public.jobs USING btree (queue, idempotency_key) WHERE (idempotency_key IS NOT NULL);

-- Name: jobs_list_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_list_idx ON public.jobs USING btree (queue, state, id) WHERE (state <> 'running'::public.job_state);

-- Name: jobs_prune_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_prune_idx ON public.jobs USING btree (queue, state, finished_at) WHERE (state = ANY (ARRAY['done'::public.job_state, 'failed'::public.job_state, 'cancelled'::public.job_state]));

-- Name: jobs_running_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_running_idx ON public.jobs USING btree (queue, id) WHERE (state = 'running'::public.job_state);

-- Name: jobs_running_key_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX jobs_running_key_idx ON public.jobs USING btree (queue, concurrency_key) WHERE ((state = 'running'::public.job_state) AND (concurrency_key IS NOT NULL));

-- Name: schedules_due_idx; Type: INDEX; Schema: public; Owner: -

CREATE INDEX schedules_due_idx ON public.schedules USING btree (next_fire_at) WHERE (NOT paused);

-- Name: job_attempts job_attempts_insert; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER job_attempts_insert INSTEAD OF INSERT ON public.job_attempts FOR EACH ROW EXECUTE FUNCTION public.job_attempts_insert();

-- Name: job_attempt_log job_attempts_tallies; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER job_attempts_tallies AFTER INSERT ON public.job_attempt_log REFERENCING NEW TABLE AS new_attempts FOR EACH STATEMENT WHEN ((current_setting('runlease.attempt_tallies'::text, true) IS DISTINCT FROM 'explicit'::text)) EXECUTE FUNCTION public.job_tallies_after_attempts();

-- Name: jobs jobs_attempts_sweep_delete; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER jobs_attempts_sweep_delete AFTER DELETE ON public.jobs FOR EACH STATEMENT WHEN ((current_setting('runlease.job_deletes'::text, true) IS DISTINCT FROM 'explicit'::text)) EXECUTE FUNCTION public.job_attempts_request_sweep();

-- Name: jobs jobs_attempts_sweep_truncate; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER jobs_attempts_sweep_truncate AFTER TRUNCATE ON public.jobs FOR EACH STATEMENT EXECUTE FUNCTION public.job_attempts_request_sweep();

-- Name: jobs jobs_tallies_recount_delete; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER jobs_tallies_recount_delete AFTER DELETE ON public.jobs FOR EACH STATEMENT WHEN ((current_setting('runlease.tally_deletes'::text, true) IS DISTINCT FROM 'explicit'::text)) EXECUTE FUNCTION public.job_tallies_request_recount();

-- Name: jobs jobs_tallies_recount_truncate; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER jobs_tallies_recount_truncate AFTER TRUNCATE ON public.jobs FOR EACH STATEMENT EXECUTE FUNCTION public.job_tallies_request_recount();

-- Name: jobs jobs_tallies_recount_update; Type: TRIGGER; Schema: public; Owner: -

CREATE TRIGGER jobs_tallies_recount_update AFTER UPDATE OF state, queue ON public.jobs FOR EACH STATEMENT WHEN ((current_setting('runlease.tallies'::text, true) IS DISTINCT FROM 'explicit'::text)) EXECUTE FUNCTION public.job_tallies_request_recount();

