# Sourced by the CI check scripts that need a coordinator running: a free
# port, the coordinator started in the background, a wait for /readyz, and
# a stop (SIGTERM, then wait) when the script exits. After it, a check that
# the coordinator's log holds no panic.
# shellcheck shell=bash

# free_port: a TCP port on 127.0.0.1 nothing listens on now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_coordinator BINARY LOG [NAME=VALUE...]: runs `BINARY serve` with the
# settings given added to the environment, its output in LOG. Sets
# `coordinator` (its pid) and `coordinator_log`, and stops it when the
# script exits.
start_coordinator() {
  local binary="$1"
  coordinator_log="$2"
  shift 2
  env "$@" "$binary" serve >"$coordinator_log" 2>&1 &
  coordinator=$!
  trap stop_coordinator EXIT
}

# stop_coordinator: SIGTERM to the coordinator started above, then waits for
# it to exit; nothing if it already has.
stop_coordinator() {
  if [[ -n "${coordinator:-}" ]] && kill -0 "$coordinator" 2>/dev/null; then
    kill -TERM "$coordinator" 2>/dev/null || true
    wait "$coordinator" 2>/dev/null || true
  fi
}

# wait_ready BASE_URL SECONDS: until GET BASE_URL/readyz answers 2xx. Fails
# with the coordinator's log when it exits first or the time runs out.
wait_ready() {
  local base="$1" deadline=$((SECONDS + $2))
  until curl -fsS "$base/readyz" >/dev/null 2>&1; do
    if ! kill -0 "$coordinator" 2>/dev/null; then
      echo "the coordinator exited during start:" >&2
      cat "$coordinator_log" >&2
      exit 1
    fi
    if [[ $SECONDS -ge $deadline ]]; then
      echo "the coordinator did not become ready on $base within $2 s:" >&2
      cat "$coordinator_log" >&2
      exit 1
    fi
    sleep 0.1
  done
}

# no_panic WHEN: fails (status 1) when the coordinator's log holds a panic,
# printing where; WHEN says when in the message ("during the run").
no_panic() {
  if grep -q "panicked" "$coordinator_log"; then
    echo "the coordinator panicked $1:" >&2
    grep -n -A5 "panicked" "$coordinator_log" >&2
    return 1
  fi
}
