-- Enqueue jobs: one multi-row insert from parallel arrays, one element per job.
-- Each job's retry policy is fixed here: a field the job sets, else its
-- queue's (queue_settings), else NULL (the coordinator's default, applied
-- when a retry is planned), and the attempt budget, else $18.
-- $1 uuid[] ids (UUIDv7, minted by the coordinator), $2 text[] queues,
-- $3 jsonb[] payloads, $4 int[] priorities, $5 timestamptz[] run_at (NULL: now()
-- plus the delay), $6 bigint[] delay_ms (NULL: 0), $7 int[] max_attempts
-- (NULL: the queue's, else $18), $8 bigint[] timeout_ms (NULL: the
-- coordinator default, applied at claim), $9 text[] idempotency keys (NULL:
-- none), $10 text[] concurrency keys (NULL: none), $11 text[] W3C
-- traceparents (NULL: none).
-- An optional column no job sets comes as one NULL instead of an array
-- (unnest reads a NULL array as NULL for every job).
-- Dependencies (store::dependencies plans them; each array NULL as a
-- whole when no job of the enqueue has any, and a NULL element is the
-- default): $12 text[] states ('blocked', or 'cancelled' for a job whose
-- dependency already failed; NULL: queued), $13 int[] dependencies,
-- $14 int[] of them not ended yet, $15 int[] dependents among the
-- enqueue's own jobs, $16 text[] on_dependency_failure, $17 text[] errors
-- (of a job cancelled at once: the dependency that failed).
-- Retry policy: $18 int default attempt budget, $19 bigint[] backoff base
-- ms, $20 bigint[] backoff max ms, $21 float8[] backoff factors, $22
-- float8[] backoff jitters, $23 bigint[] retry windows ms (NULL: the
-- queue's).
-- Tallies: the store counts the rows answered cancelled (tally::entered).
-- This file is the insert's head: job_enqueue_keyed.sql follows it when a job
-- of the enqueue has an idempotency key, then job_enqueue_returning.sql. Without
-- keys no row can conflict, and an insert without an arbiter index writes
-- each row once instead of speculatively (a lock and a WAL record less per
-- job).
-- Index: queue_settings_pkey, one lookup per job (a small table, read, not
-- locked).
-- Locking: inserts only.
INSERT INTO jobs (id, queue, payload, priority, run_at, max_attempts, timeout_ms, idempotency_key,
                  concurrency_key, traceparent, state, dependencies, dependencies_pending, dependents,
                  on_dependency_failure, error, finished_at, backoff_base_ms, backoff_max_ms,
                  backoff_factor, backoff_jitter, retry_window_ms)
SELECT t.id, t.queue, t.payload, t.priority,
       coalesce(t.run_at, now() + coalesce(t.delay_ms, 0) * interval '1 millisecond'),
       coalesce(t.max_attempts, s.max_attempts, $18::int), t.timeout_ms, t.idempotency_key,
       t.concurrency_key, t.traceparent,
       coalesce(t.state, 'queued')::job_state, coalesce(t.dependencies, 0),
       coalesce(t.pending, 0), coalesce(t.dependents, 0), t.on_dependency_failure, t.error,
       CASE WHEN t.state = 'cancelled' THEN now() END,
       coalesce(t.backoff_base_ms, s.backoff_base_ms), coalesce(t.backoff_max_ms, s.backoff_max_ms),
       coalesce(t.backoff_factor, s.backoff_factor), coalesce(t.backoff_jitter, s.backoff_jitter),
       coalesce(t.retry_window_ms, s.retry_window_ms)
FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::int[], $5::timestamptz[],
            $6::bigint[], $7::int[], $8::bigint[], $9::text[], $10::text[], $11::text[],
            $12::text[], $13::int[], $14::int[], $15::int[], $16::text[], $17::text[],
            $19::bigint[], $20::bigint[], $21::float8[], $22::float8[], $23::bigint[])
     AS t(id, queue, payload, priority, run_at, delay_ms, max_attempts, timeout_ms, idempotency_key,
          concurrency_key, traceparent, state, dependencies, pending, dependents,
          on_dependency_failure, error, backoff_base_ms, backoff_max_ms, backoff_factor,
          backoff_jitter, retry_window_ms)
-- Per job, in the order given (a lateral lookup keeps the input's order,
-- which decides which of two jobs with one key in a batch is inserted;
-- LIMIT 1 keeps it from being flattened into a join that could reorder).
LEFT JOIN LATERAL (SELECT max_attempts, backoff_base_ms, backoff_max_ms, backoff_factor, backoff_jitter,
                          retry_window_ms
                   FROM queue_settings WHERE queue_settings.queue = t.queue LIMIT 1) s ON true
