-- The PostgreSQL server a connection reached, for /readyz: its address and
-- port as it sees them ('local socket' over a Unix socket), and whether it
-- takes writes (not a standby in recovery, not read-only by default).
SELECT
    coalesce(host(inet_server_addr()) || ':' || inet_server_port(), 'local socket') AS server,
    NOT pg_is_in_recovery() AND current_setting('transaction_read_only') = 'off' AS writable
