-- runlease schema, version 12: job dependencies. A job enqueued with
-- dependencies waits in the new state `blocked` until each of them has
-- ended; the statement that ends the last one moves it on to `queued` (or,
-- when a dependency failed, cancels it), so no poller is involved.
--
-- Locking: ALTER TABLE takes jobs' ACCESS EXCLUSIVE lock until the
-- migration commits. The new columns have constant defaults, so no row is
-- rewritten; the new table starts empty.

-- The new state. A value added to an enum in a transaction cannot be used
-- before that transaction commits, and every pending migration applies in
-- one transaction: the constraint below compares the state's text instead.
ALTER TYPE job_state ADD VALUE IF NOT EXISTS 'blocked';

-- dependencies: how many jobs this one depends on (0 for almost every job:
-- a claim looks the dependencies up for its lease only when it is not).
-- dependencies_pending: of those, how many have not ended yet while the
-- job is blocked; 0 in every other state (so it tells blocked jobs apart
-- without naming the new state, which an index here cannot).
-- dependents: how many jobs were ever enqueued depending on this one, each
-- enqueue adding its own under this row's lock. The statement that ends a
-- job looks for its dependents only when it is not 0; a value that moved
-- between the statement's snapshot and its lock tells it that a dependent
-- was enqueued meanwhile, one its snapshot cannot see.
-- on_dependency_failure: what a failed dependency does to the job: 'cancel'
-- (it is cancelled) or 'run' (it counts as met). NULL without dependencies.
ALTER TABLE jobs ADD COLUMN dependencies integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN dependencies_pending integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN dependents integer NOT NULL DEFAULT 0;
ALTER TABLE jobs ADD COLUMN on_dependency_failure text;
ALTER TABLE jobs ADD CONSTRAINT jobs_dependencies CHECK (
    dependencies BETWEEN 0 AND 100
    AND dependencies_pending BETWEEN 0 AND dependencies
    AND dependents >= 0
    AND (on_dependency_failure IS NULL) = (dependencies = 0)
    AND (on_dependency_failure IS NULL OR on_dependency_failure IN ('cancel', 'run'))
    AND (state::text = 'blocked') = (dependencies_pending > 0));

-- One row per edge: job_id depends on depends_on_id. Rows stay while the
-- dependent exists (its lease and its view list them, also once the
-- dependency is gone); the statements that delete jobs delete their rows.
-- No foreign keys: a dependency may be deleted before its dependents, and
-- the ends of jobs without dependencies pay for no trigger.
-- settled: the edge has been counted for its dependent, when its dependency
-- ended (or at enqueue, when it had already ended): a dependency that ends
-- again after an admin retry is not counted a second time.
CREATE TABLE job_dependencies (
    job_id        uuid NOT NULL,
    depends_on_id uuid NOT NULL,
    settled       boolean NOT NULL DEFAULT false,
    PRIMARY KEY (job_id, depends_on_id)
);

-- A job's dependents, for the statement that ends it.
CREATE INDEX job_dependencies_depends_on_idx ON job_dependencies (depends_on_id, job_id);

-- Blocked jobs, for the queue figures (a count of live rows only, as for
-- the other live states).
CREATE INDEX jobs_blocked_idx ON jobs (queue) WHERE dependencies_pending > 0;
