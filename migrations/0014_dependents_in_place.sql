-- runlease schema, version 14: dependents settled in place.
-- Blocked jobs are indexed by their state. Version 12 indexed blocked jobs on `dependencies_pending > 0`: a column
-- that every end of a dependency changes on each job waiting on it. A
-- change to a column an index names (its predicate included) keeps
-- PostgreSQL from updating the row in place (a HOT update): every such
-- count went into every index of jobs as a new entry, so a job waiting on
-- a hundred others left a hundred entries in jobs_pkey for lookups to walk.
-- Keyed on the state instead, which stays `blocked` until the last count,
-- those updates stay in place.
-- `blocked` is the last value of job_state (version 12 appended it), and
-- a value added to an enum cannot be named in the transaction that adds
-- it, which on a new database is this one: the predicate says "after
-- enqueue_failed", the value before it, which only `blocked` is.
--
-- An edge is written once more after its insert (marked settled when its
-- dependency ends): with room left in its page, that update stays in place
-- too, instead of adding entries to both of the edges' indexes. Half of
-- each new page is kept free for it (pages written before stay as they
-- are).
--
-- Locking: DROP INDEX and CREATE INDEX hold jobs' locks until the
-- migration commits; the new index reads the whole table once (writes wait
-- meanwhile: on a large table, upgrade at a quiet time).
DROP INDEX jobs_blocked_idx;
CREATE INDEX jobs_blocked_idx ON jobs (queue) WHERE state > 'enqueue_failed'::job_state;
ALTER TABLE job_dependencies SET (fillfactor = 50);
