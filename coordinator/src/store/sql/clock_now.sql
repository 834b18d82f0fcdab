-- PostgreSQL's clock, the one clock of runlease (schedules start from it).
-- No parameters. Index: none. Locking: none.
SELECT now() AS now
