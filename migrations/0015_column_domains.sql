-- runlease schema, version 15: the checks of a single column of jobs held
-- by its type. PostgreSQL reads every CHECK constraint of a table back
-- from its stored form, plans and compiles it at the start of each
-- statement that writes a row of the table, whichever columns it changes:
-- the sixteen of jobs cost more than the row's own update when a statement
-- carries one job (a claim, a finish, an enqueue under light load). A
-- domain's checks are kept planned by each connection, and run only where
-- a value of the domain is written: an insert, or an update that sets the
-- column. So the rules of one column (the trace context's form, the retry
-- policy's ranges, the attempt budget, the timeout, the dependency counts)
-- move into domains, the same rules under new names; the checks that tie
-- the state to other columns stay on the table, and so do the lengths of
-- the queue's name and of the keys: their columns are indexed, and a
-- column's new type would rebuild every index that names it.
--
-- Locking: ALTER TABLE takes jobs' ACCESS EXCLUSIVE lock until the
-- migration commits; nothing here reads or rewrites its rows or indexes
-- (no column changed here is indexed). A column given a domain that has
-- checks is rewritten (each value checked), so the domains are created
-- without checks, given to the columns (the same storage: no rewrite),
-- and then given their checks as NOT VALID, which holds every value
-- written from now on; the values already stored passed the same rules as
-- table constraints. The two budget checks and the dependency check of
-- the table name columns whose type changes, so they are dropped first
-- and added again (the dependency check without the rules its columns'
-- domains now hold), NOT VALID for the same reason.

ALTER TABLE jobs
    DROP CONSTRAINT jobs_traceparent_form,
    DROP CONSTRAINT jobs_max_attempts_positive,
    DROP CONSTRAINT jobs_timeout_positive,
    DROP CONSTRAINT jobs_retry_policy,
    DROP CONSTRAINT jobs_dependencies,
    DROP CONSTRAINT jobs_attempt_in_budget,
    DROP CONSTRAINT jobs_claimable_has_budget;

-- A W3C trace context, version 00.
CREATE DOMAIN trace_context AS text;
-- How many attempts a job may start: at least one.
CREATE DOMAIN attempt_budget AS integer;
-- An attempt's lease timeout: a zero or negative one would reap every
-- attempt at once.
CREATE DOMAIN lease_timeout_ms AS bigint;
-- A retry's backoff base and cap.
CREATE DOMAIN backoff_ms AS bigint;
-- How much each retry's backoff grows: 1 to 10.
CREATE DOMAIN backoff_factor AS double precision;
-- The share of a backoff drawn at random: 0 to 1.
CREATE DOMAIN backoff_jitter AS double precision;
-- How long after the first attempt started a retry may start.
CREATE DOMAIN retry_window_ms AS bigint;
-- How many jobs a job depends on: at most 100.
CREATE DOMAIN dependency_count AS integer;
-- A count of jobs kept on a row (dependencies pending, dependents).
CREATE DOMAIN job_count AS integer;
-- What a failed dependency does to its dependent.
CREATE DOMAIN dependency_failure AS text;

ALTER TABLE jobs
    ALTER COLUMN traceparent TYPE trace_context,
    ALTER COLUMN max_attempts TYPE attempt_budget,
    ALTER COLUMN timeout_ms TYPE lease_timeout_ms,
    ALTER COLUMN backoff_base_ms TYPE backoff_ms,
    ALTER COLUMN backoff_max_ms TYPE backoff_ms,
    ALTER COLUMN backoff_factor TYPE backoff_factor,
    ALTER COLUMN backoff_jitter TYPE backoff_jitter,
    ALTER COLUMN retry_window_ms TYPE retry_window_ms,
    ALTER COLUMN dependencies TYPE dependency_count,
    ALTER COLUMN dependencies_pending TYPE job_count,
    ALTER COLUMN dependents TYPE job_count,
    ALTER COLUMN on_dependency_failure TYPE dependency_failure;

ALTER DOMAIN trace_context ADD CONSTRAINT trace_context_form
    CHECK (VALUE ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
ALTER DOMAIN attempt_budget ADD CONSTRAINT attempt_budget_positive CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN lease_timeout_ms ADD CONSTRAINT lease_timeout_ms_positive CHECK (VALUE > 0) NOT VALID;
ALTER DOMAIN backoff_ms ADD CONSTRAINT backoff_ms_nonnegative CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN backoff_factor ADD CONSTRAINT backoff_factor_range CHECK (VALUE BETWEEN 1 AND 10) NOT VALID;
ALTER DOMAIN backoff_jitter ADD CONSTRAINT backoff_jitter_range CHECK (VALUE BETWEEN 0 AND 1) NOT VALID;
ALTER DOMAIN retry_window_ms ADD CONSTRAINT retry_window_ms_positive CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN dependency_count ADD CONSTRAINT dependency_count_range CHECK (VALUE BETWEEN 0 AND 100) NOT VALID;
ALTER DOMAIN job_count ADD CONSTRAINT job_count_nonnegative CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN dependency_failure ADD CONSTRAINT dependency_failure_action
    CHECK (VALUE IN ('cancel', 'run')) NOT VALID;

-- The checks that stay on the table: the attempt budget (as before), and
-- what of version 12's dependency check ties columns together (naming the
-- state by its text, as version 12 did: on a new database every migration
-- runs in one transaction, in which the value 'blocked' it adds cannot be
-- named).
ALTER TABLE jobs ADD CONSTRAINT jobs_attempt_in_budget
    CHECK (attempt >= 0 AND attempt <= max_attempts) NOT VALID;
ALTER TABLE jobs ADD CONSTRAINT jobs_claimable_has_budget
    CHECK (state NOT IN ('queued', 'enqueue_failed') OR attempt < max_attempts) NOT VALID;
ALTER TABLE jobs ADD CONSTRAINT jobs_dependencies CHECK (
    dependencies_pending <= dependencies
    AND (on_dependency_failure IS NULL) = (dependencies = 0)
    AND (state::text = 'blocked') = (dependencies_pending > 0)) NOT VALID;
