-- runlease schema, version 5: trace context. The W3C traceparent a producer
-- enqueued a job with, handed to its worker on every lease so the worker's
-- span joins the producer's trace.

-- A nullable column without a default: PostgreSQL records it in the
-- catalog only (no rewrite of jobs, no pass over its rows). Its ACCESS
-- EXCLUSIVE lock is held until the migration commits, a moment, as nothing
-- here scans the table; the check is NOT VALID for that reason (every
-- existing row holds NULL; new and updated rows are checked). The
-- coordinator validates the value before storing it; the check keeps any
-- other writer to the version-00 form.
ALTER TABLE jobs ADD COLUMN traceparent text;
ALTER TABLE jobs ADD CONSTRAINT jobs_traceparent_form CHECK (
    traceparent IS NULL OR traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
