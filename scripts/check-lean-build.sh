#!/usr/bin/env bash
# The coordinator's optional parts stay optional:
# - `--no-default-features` (no `sqs`) builds a coordinator without the AWS
#   SDK and its TLS stack: the build must succeed, its normal dependency tree
#   must hold no `aws-` crate, and the binary must refuse to start when
#   RUNLEASE_SQS_QUEUES names queues (rather than ignore them) while starting
#   normally without it.
# - `--features otlp` (the OpenTelemetry exporter, off by default) builds.
# The default binary in the target dir's debug/ is rebuilt at the end, since
# the lean build replaces it there (the e2e tests and other checks start it).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*" >&2; }
# shellcheck source=scripts/live-coordinator.sh
source scripts/live-coordinator.sh
package=runlease-coordinator

log "$package --no-default-features: dependency tree"
tree=$(cargo tree -p "$package" --no-default-features -e normal --prefix none --format '{p}')
aws=$(printf '%s\n' "$tree" | awk '{print $1}' | sort -u | grep -E '^aws-' || true)
if [ -n "$aws" ]; then
  echo "$package --no-default-features still depends on AWS crates:" >&2
  printf '  %s\n' $aws >&2
  echo "Find who pulls them in: cargo tree -p $package --no-default-features -e normal -i <crate>" >&2
  exit 1
fi
lean_crates=$(printf '%s\n' "$tree" | awk '{print $1}' | sort -u | wc -l)
full_crates=$(cargo tree -p "$package" -e normal --prefix none --format '{p}' | awk '{print $1}' | sort -u | wc -l)
echo "$package: $lean_crates crates without default features (no aws- crate), $full_crates with them"

log "$package --no-default-features: debug build"
cargo build -q -p "$package" --no-default-features --bin runlease-coordinator
debug_dir="${CARGO_TARGET_DIR:-target}/debug"
lean_dir="$debug_dir/lean"
mkdir -p "$lean_dir"
cp "$debug_dir/runlease-coordinator" "$lean_dir/runlease-coordinator"
lean="$lean_dir/runlease-coordinator"

log "the lean coordinator refuses SQS bindings at start-up"
set +e
out=$(RUNLEASE_SQS_QUEUES="lambda-jobs=http://127.0.0.1:1/000000000000/lambda-jobs" \
  RUNLEASE_LISTEN=127.0.0.1:0 RUNLEASE_REDIS_URL= timeout 30 "$lean" serve 2>&1)
rc=$?
set -e
if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || ! grep -q "built without SQS dispatch" <<<"$out"; then
  echo "expected the lean coordinator to exit with a configuration error naming the missing SQS feature; exit $rc, output:" >&2
  printf '%s\n' "$out" >&2
  exit 1
fi
echo "refused (exit $rc): $(grep -o 'RUNLEASE_SQS_QUEUES binds.*' <<<"$out" | head -n 1)"

log "the lean coordinator serves without SQS bindings"
port=$(free_port)
db="runlease_lean_check_$$"
drop_db() { psql -h 127.0.0.1 -U postgres -qc "DROP DATABASE IF EXISTS $db" >/dev/null 2>&1 || true; }
start_coordinator "$lean" "$lean_dir/serve.log" \
  RUNLEASE_DATABASE_URL="postgres://postgres@127.0.0.1:5432/$db" RUNLEASE_LISTEN="127.0.0.1:$port" \
  RUNLEASE_REDIS_URL=
trap 'stop_coordinator; drop_db' EXIT
wait_ready "http://127.0.0.1:$port" 20
echo "ready on 127.0.0.1:$port"
stop_coordinator
drop_db
trap - EXIT

# A debug build rather than `cargo check`: it reuses the dependencies the
# default build compiled (check keeps artifacts of its own) and proves it links.
log "$package --features otlp: debug build"
cargo build -q -p "$package" --features otlp --bin runlease-coordinator

log "restoring the default $package binary in $debug_dir"
cargo build -q -p "$package" --bin runlease-coordinator
