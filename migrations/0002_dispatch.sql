-- runlease schema, version 2: SQS wake-ups (dispatch) for Lambda workers.
-- A job on a queue bound to SQS needs a wake-up each time it becomes due:
-- when enqueued, and again after a retry, a release or a reap moved its
-- run_at. dispatched_run_at is the run_at its last wake-up went out for.

ALTER TABLE jobs ADD COLUMN dispatched_run_at timestamptz;

-- Dispatch: claimable jobs whose current due time has not been signalled yet.
CREATE INDEX jobs_dispatch_idx ON jobs (queue, run_at)
    WHERE state IN ('queued', 'enqueue_failed') AND dispatched_run_at IS DISTINCT FROM run_at;
