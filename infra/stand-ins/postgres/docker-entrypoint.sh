#!/bin/bash
# As the official image's entrypoint, for what a compose file relies on: on
# first start (an empty $PGDATA) initdb with POSTGRES_USER and
# POSTGRES_PASSWORD, scram-sha-256 for network clients, then POSTGRES_DB
# created; every start runs `postgres` as the postgres user, listening on all
# addresses. A later start with an initialised volume keeps its data.
set -euo pipefail
if [ "${1:0:1}" = '-' ]; then
  set -- postgres "$@"
fi
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
  mkdir -p "$PGDATA" && chown postgres:postgres "$PGDATA" && chmod 700 "$PGDATA"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set (the official image refuses to start without it too)}"
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    chown postgres "$pwfile"
    as_postgres initdb --username="$user" --pwfile="$pwfile" --auth-local=trust \
      --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    printf 'host all all all scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    as_postgres pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" -l /tmp/init.log start >/dev/null
    if [ "$db" != postgres ]; then
      as_postgres psql -v ON_ERROR_STOP=1 -q --username="$user" --dbname=postgres \
        -c "CREATE DATABASE \"$db\""
    fi
    as_postgres pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
    echo "PostgreSQL initialised in $PGDATA (user $user, database $db)"
  fi
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$@" -c listen_addresses='*'
fi
exec "$@"
