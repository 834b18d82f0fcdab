-- Take an advisory lock for this transaction, if no other replica holds
-- it: the prune lock (pruning and folding run on one replica at a time)
-- or the recount lock (one recount of the tallies at a time). A replica
-- that stops (or loses its connection) frees the lock with its
-- transaction.
-- $1 bigint lock key.
-- Index: none. Locking: a transaction-level advisory lock; never waits.
SELECT pg_try_advisory_xact_lock($1::bigint) AS locked
