#!/usr/bin/env bash
# Property-based check that the coordinator and docs/openapi.yaml agree:
# schemathesis generates requests from the spec (valid and invalid ones) and
# sends them to a live debug coordinator on real PostgreSQL, with its checks
# for server errors, undocumented status codes and answers that do not match
# their documented schema. Any finding fails the script.
#
# Needs PostgreSQL on 127.0.0.1:5432 (trust, user postgres) and python3; the
# Python tools come from PyPI (scripts/requirements-ci.txt). Knobs:
# SCHEMATHESIS_MAX_EXAMPLES (default 150 per operation: about a minute),
# SCHEMATHESIS_SEED (default fixed, so CI runs are repeatable),
# SCHEMATHESIS_TIMEOUT (seconds, default 600: a hung run fails, not CI).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

# shellcheck source=scripts/pytools.sh
source scripts/pytools.sh
# shellcheck source=scripts/live-coordinator.sh
source scripts/live-coordinator.sh
for tool in psql curl python3 cargo; do
  command -v "$tool" >/dev/null || { echo "schemathesis.sh needs $tool on PATH" >&2; exit 1; }
done
pytools_setup

target="${CARGO_TARGET_DIR:-$root/target}"
db_name=runlease_schemathesis
admin_url="${RUNLEASE_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
work="$target/schemathesis"
rm -rf "$work"
mkdir -p "$work"
log="$work/coordinator.log"

echo "== OpenAPI document is valid (openapi-spec-validator)"
"$PYTOOLS/openapi-spec-validator" docs/openapi.yaml

echo "== building the debug coordinator"
cargo build --quiet -p runlease-coordinator --bin runlease-coordinator
binary="$target/debug/runlease-coordinator"

echo "== fresh database $db_name"
psql "$admin_url" -v ON_ERROR_STOP=1 -q -c "DROP DATABASE IF EXISTS $db_name WITH (FORCE)"

port="$(free_port)"
base="http://127.0.0.1:$port"
server_url="${admin_url%/*}/$db_name"

echo "== starting the coordinator on $base (log: $log)"
start_coordinator "$binary" "$log" \
  RUNLEASE_DATABASE_URL="$server_url" \
  RUNLEASE_LISTEN="127.0.0.1:$port" \
  RUNLEASE_SECRET="schemathesis-secret-0123456789abcdef" \
  RUNLEASE_REDIS_PREFIX="runlease-schemathesis-$$" \
  RUNLEASE_REAPER_INTERVAL_MS=1000 \
  RUNLEASE_SHUTDOWN_GRACE_MS=5000
wait_ready "$base" 20

echo "== schemathesis $("$PYTOOLS/schemathesis" --version | awk '{print $NF}') against $base/openapi.yaml"
# Lease tokens schemathesis makes up are malformed (400) or forged (409); the
# hooks put real ones (and real job ids) into about half of the cases, so
# the generated values also go through PostgreSQL, and the OpenAPI links
# (enqueue -> claim -> complete, fail, ...) chain real calls in the stateful
# phase. Schemathesis runs from $work, where it keeps its own state.
status=0
cd "$work"
SCHEMATHESIS_HOOKS="$root/scripts/schemathesis_hooks.py" \
RUNLEASE_SCHEMATHESIS_URL="$base" \
SCHEMATHESIS_SEED="${SCHEMATHESIS_SEED:-20250601}" \
  timeout "${SCHEMATHESIS_TIMEOUT:-600}" "$PYTOOLS/schemathesis" run "$base/openapi.yaml" \
  --url "$base" \
  --checks not_a_server_error,status_code_conformance,response_schema_conformance \
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-150}" \
  --seed "${SCHEMATHESIS_SEED:-20250601}" \
  --workers 1 \
  --request-timeout 20 \
  --suppress-health-check too_slow,filter_too_much,data_too_large \
  --report junit --report-dir "$work/report" \
  2>&1 | tee "$work/output.txt" || status=$?
cd "$root"

# Belt and braces: the coordinator's own count of 5xx answers must be zero.
if ! metrics="$(curl -fsS "$base/metrics")"; then
  echo "the coordinator does not answer /metrics after the run" >&2
  status=1
elif grep -q 'status="5xx"' <<<"$metrics"; then
  echo "the coordinator answered 5xx during the run:" >&2
  grep 'status="5xx"' <<<"$metrics" | grep _count >&2
  status=1
fi

stop_coordinator
trap - EXIT
no_panic "during the run" || status=1
if [[ $status -ne 0 ]]; then
  echo "schemathesis found problems (exit $status); coordinator log: $log" >&2
  exit "$status"
fi
# The count of generated test cases, as a closing "N passed, N failed" line.
cases="$(grep -Eo '^ *[0-9]+ generated, [0-9]+ passed' "$work/output.txt" | awk '{print $3}' | tail -1)"
if [[ -z "$cases" || "$cases" -eq 0 ]]; then
  echo "schemathesis ran no test case (or its summary changed); see $work/output.txt" >&2
  exit 1
fi
echo "schemathesis: $cases passed, 0 failed"
