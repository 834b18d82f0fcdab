#!/bin/sh
# As the official image's entrypoint: a command starting with a flag is
# passed to redis-server; redis-server runs as `redis` with protected mode off
# (later arguments still override it).
set -e
if [ "${1#-}" != "$1" ]; then
  set -- redis-server "$@"
fi
if [ "$1" = redis-server ]; then
  shift
  set -- redis-server --protected-mode no "$@"
  if [ "$(id -u)" = 0 ]; then
    chown -R redis:redis /data
    exec setpriv --reuid=redis --regid=redis --init-groups "$@"
  fi
fi
exec "$@"
