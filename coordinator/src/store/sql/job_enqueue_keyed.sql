-- The arbiter of an enqueue whose jobs carry idempotency keys (follows
-- job_enqueue.sql): a job whose (queue, key) already exists, or came earlier
-- in the same enqueue, is skipped, and the caller reads the original with
-- job_get_by_idempotency_key.
-- Index: jobs_idempotency_key_uniq.
-- Locking: a concurrent insert of the same key waits for the first to commit,
-- then is skipped.
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
