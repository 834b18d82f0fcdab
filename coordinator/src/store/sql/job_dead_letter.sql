-- Enqueue the dead-letter follow-ups of jobs that a finish or a reap of the
-- same transaction failed for good (lease_finish.sql and lease_reap.sql
-- answer, for each, its queue's dead-letter queue and the id the follow-up
-- takes): one job on the dead-letter queue per failed lease, as an enqueue would make it (the
-- dead-letter queue's own retry policy; the default attempt budget where
-- it sets none), payload {job_id, queue, payload, error, attempts}.
-- $1 uuid[] follow-up ids, $2 text[] dead-letter queues, $3 uuid[] failed
-- jobs, $4 text[] their queues, $5 bigint[] their run leases, $6 jsonb[]
-- their payloads, $7 text[] their errors, $8 int[] their attempts, $9
-- text[] their traceparents (parallel arrays), $10 int default attempt
-- budget.
-- Its idempotency key names the failed lease, which only one statement
-- could end: no second follow-up, whatever else ends or repeats. (The key is
-- reserved: a job enqueued by hand with it would stand in for the
-- follow-up.)
-- Tallies: a follow-up is queued, which no tally counts (`Changes::untallied`).
-- Answers the follow-ups enqueued.
-- Index: queue_settings_pkey, jobs_idempotency_key_uniq.
-- Locking: the new rows only.
INSERT INTO jobs (id, queue, payload, max_attempts, idempotency_key, traceparent,
                  backoff_base_ms, backoff_max_ms, backoff_factor, backoff_jitter, retry_window_ms)
SELECT t.id, t.dead_letter_queue,
       jsonb_build_object('job_id', t.job_id, 'queue', t.queue, 'payload', t.payload,
                          'error', t.error, 'attempts', t.attempt),
       coalesce(d.max_attempts, $10::int), 'dead-letter:' || t.job_id || ':' || t.run_lease, t.traceparent,
       d.backoff_base_ms, d.backoff_max_ms, d.backoff_factor, d.backoff_jitter, d.retry_window_ms
FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::bigint[], $6::jsonb[], $7::text[],
            $8::int[], $9::text[])
     AS t(id, dead_letter_queue, job_id, queue, run_lease, payload, error, attempt, traceparent)
LEFT JOIN queue_settings d ON d.queue = t.dead_letter_queue
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, queue
