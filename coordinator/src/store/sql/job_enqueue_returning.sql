-- The end of either form of the enqueue's insert: the jobs written, whole
-- (each request is answered its job).
RETURNING *
