-- Enqueue jobs: one multi-row insert from parallel arrays, one element per job.
-- $1 uuid[] ids (UUIDv7, minted by the coordinator), $2 text[] queues,
-- $3 jsonb[] payloads, $4 int[] priorities, $5 timestamptz[] run_at (NULL: now()
-- plus the delay), $6 bigint[] delay_ms (NULL: 0), $7 int[] max_attempts,
-- $8 bigint[] timeout_ms (NULL: the coordinator default, applied at claim),
-- $9 text[] idempotency keys (NULL: none), $10 text[] concurrency keys (NULL: none),
-- $11 text[] W3C traceparents (NULL: none).
-- Dependencies (store::dependencies plans them; each array NULL as a
-- whole when no job of the enqueue has any, and a NULL element is the
-- default): $12 text[] states ('blocked', or 'cancelled' for a job whose
-- dependency already failed; NULL: queued), $13 int[] dependencies,
-- $14 int[] of them not ended yet, $15 int[] dependents among the
-- enqueue's own jobs, $16 text[] on_dependency_failure, $17 text[] errors
-- (of a job cancelled at once: the dependency that failed).
-- Tallies: the store counts the rows answered cancelled (tally::entered).
-- Index: jobs_idempotency_key_uniq. A job whose (queue, key) already exists is
-- skipped and the caller reads the original with job_get_by_idempotency_key.
-- Locking: inserts only; a concurrent insert of the same key waits for the first
-- to commit, then is skipped.
INSERT INTO jobs (id, queue, payload, priority, run_at, max_attempts, timeout_ms, idempotency_key,
                  concurrency_key, traceparent, state, dependencies, dependencies_pending, dependents,
                  on_dependency_failure, error, finished_at)
SELECT t.id, t.queue, t.payload, t.priority,
       coalesce(t.run_at, now() + coalesce(t.delay_ms, 0) * interval '1 millisecond'),
       t.max_attempts, t.timeout_ms, t.idempotency_key, t.concurrency_key, t.traceparent,
       coalesce(t.state, 'queued')::job_state, coalesce(t.dependencies, 0),
       coalesce(t.pending, 0), coalesce(t.dependents, 0), t.on_dependency_failure, t.error,
       CASE WHEN t.state = 'cancelled' THEN now() END
FROM unnest($1::uuid[], $2::text[], $3::jsonb[], $4::int[], $5::timestamptz[],
            $6::bigint[], $7::int[], $8::bigint[], $9::text[], $10::text[], $11::text[],
            $12::text[], $13::int[], $14::int[], $15::int[], $16::text[], $17::text[])
     AS t(id, queue, payload, priority, run_at, delay_ms, max_attempts, timeout_ms, idempotency_key,
          concurrency_key, traceparent, state, dependencies, pending, dependents,
          on_dependency_failure, error)
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *
