-- Row versions of the jobs table, live and dead, as PostgreSQL's
-- statistics count them (updated as transactions end; vacuum takes the dead
-- ones off): whether queue figures may be slow to read because of its size.
-- No parameters.
-- Index: none (the statistics of one table). Locking: none.
SELECT (pg_stat_get_live_tuples('jobs'::regclass)
        + pg_stat_get_dead_tuples('jobs'::regclass))::bigint AS n
