-- Settle the dependents of jobs that an earlier statement of the same
-- transaction ended (a finish, a reap, a cancel, a delete, or the cancels
-- of the level above), each of those rows still locked by it.
-- $1 uuid[] ended jobs, $2 text[] how each ended ('done', 'failed',
-- 'cancelled' or 'deleted'), parallel arrays; the store passes only jobs
-- whose `dependents` is not 0.
-- Each blocked job that waits on an ended job is settled, once, for all
-- the ended jobs it waits on (the UPDATE below changes a row once, however
-- many ended dependencies it has): a dependency ended 'done' is met; one
-- ended otherwise fails, which cancels the job when its
-- on_dependency_failure is 'cancel' (its error names the dependency) and
-- counts as met when it is 'run'. A job with no dependency left pending is
-- queued (claimable from now on, or at its own later run_at).
-- The jobs it cancels are answered with their `dependents`: the store
-- settles their dependents in turn, a level per statement, in the same
-- transaction (the graph has no cycles: a job depends only on jobs that
-- existed before it, or on earlier jobs of its batch).
-- Answers: id, run_lease, queue, state (queued, cancelled, or still
-- blocked), created_at, finished_at, dependents, traced.
-- Tallies: a job it cancels enters `cancelled` (tally::entered).
-- Index: job_dependencies_depends_on_idx (the edges of each ended job),
-- then jobs_pkey; the edges counted are marked by their tuple ids.
-- Locking: the waiting jobs are locked in id order (`settled` updates them
-- in the order of `counted`), after the ended ones, so two statements that
-- settle dependents of the same jobs cannot deadlock on them. Their state
-- and count are read on the locked row as it is now: of two transactions
-- that end a job's last two dependencies at once, the second waits for the
-- first's commit and then sees its count, so exactly one of them queues
-- the job. The edges are read in this statement's snapshot, taken after
-- the ended jobs were locked: every dependent enqueued before (an enqueue
-- takes its dependency's row lock) is seen, and none can be enqueued
-- before this transaction commits.
WITH ended AS (
    SELECT t.id, t.state
    FROM unnest($1::uuid[], $2::text[]) AS t(id, state)
), waiting AS (
    -- Edges not counted yet: a dependency that ended before (and was
    -- retried by an admin since) counts once.
    SELECT d.job_id, e.id AS dependency, e.state, d.ctid AS edge
    FROM ended e
    JOIN job_dependencies d ON d.depends_on_id = e.id
    WHERE NOT d.settled
), counted AS MATERIALIZED (
    -- Per waiting job, in id order (the order `settled` locks them in): how
    -- many of its dependencies ended here, the tuples of those edges, and
    -- the first that failed.
    SELECT w.job_id, count(*)::int AS n, array_agg(w.edge) AS edges,
           (array_agg('dependency ' || w.dependency::text || ' '
                      || CASE w.state WHEN 'cancelled' THEN 'was cancelled'
                                      WHEN 'deleted' THEN 'was deleted'
                                      ELSE 'failed' END
                      ORDER BY w.dependency) FILTER (WHERE w.state <> 'done'))[1] AS failure
    FROM waiting w
    GROUP BY w.job_id
    ORDER BY w.job_id
), settled AS (
    UPDATE jobs j SET
        state = CASE WHEN c.failure IS NOT NULL AND j.on_dependency_failure = 'cancel' THEN 'cancelled'::job_state
                     WHEN j.dependencies_pending <= c.n THEN 'queued'::job_state
                     ELSE 'blocked'::job_state END,
        dependencies_pending = CASE WHEN c.failure IS NOT NULL AND j.on_dependency_failure = 'cancel' THEN 0
                                    ELSE greatest(j.dependencies_pending - c.n, 0) END,
        error = CASE WHEN c.failure IS NOT NULL AND j.on_dependency_failure = 'cancel' THEN c.failure
                     ELSE j.error END,
        finished_at = CASE WHEN c.failure IS NOT NULL AND j.on_dependency_failure = 'cancel' THEN now()
                           ELSE j.finished_at END,
        run_at = CASE WHEN c.failure IS NOT NULL AND j.on_dependency_failure = 'cancel' THEN j.run_at
                      WHEN j.dependencies_pending <= c.n THEN greatest(j.run_at, now())
                      ELSE j.run_at END,
        updated_at = now()
    -- Reached from the counts in their order, one jobs_pkey lookup each
    -- (the statement runs with nested loops only: every join here has an
    -- index on its inner side, so a fan-out of thousands costs thousands
    -- of lookups, not their square); the state test sits in a CASE so that
    -- the planner never walks every blocked job through an index on the
    -- state instead. Each row is locked as the update reaches it, and its
    -- state and count are read as the lock found them.
    FROM counted c
    WHERE j.id = c.job_id AND CASE WHEN j.state = 'blocked' THEN true ELSE false END
    RETURNING j.id, j.run_lease, j.queue, j.state, j.created_at, j.finished_at, j.dependents,
              j.traceparent IS NOT NULL AS traced, c.edges
), edges_settled AS (
    -- The edges just counted, of the dependents settled (each one locked
    -- and still blocked), each reached by the tuple `waiting` read (a
    -- job may wait on a hundred others: looked up by the dependent, every
    -- edge counted would read all of them). No other statement changes an
    -- edge of a job whose row this one holds locked: the tuple read is the
    -- edge as it is.
    UPDATE job_dependencies d SET settled = true
    FROM settled c, unnest(c.edges) AS e(edge)
    WHERE d.ctid = e.edge
)
SELECT id, run_lease, queue, state, created_at, finished_at, dependents, traced FROM settled
