#!/usr/bin/env bash
# Runs the coordinator's cargo-fuzz targets (fuzz/fuzz_targets/) for a
# bounded time each, from their committed corpora, and fails if any target
# crashes (a panic, a broken invariant, or one input taking longer than
# FUZZ_INPUT_TIMEOUT seconds).
#
#   bash scripts/fuzz.sh                 # every target, FUZZ_SECONDS (30) each
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh lease_token request_body
#
# The committed corpus (fuzz/corpus/<target>/) is only read: the inputs a
# run finds go to a temporary directory, deleted afterwards (FUZZ_KEEP=1
# keeps it and prints where; `cargo fuzz cmin` then merges what is worth
# committing). A crash's input is saved under fuzz/artifacts/<target>/, and
# the command that replays it is printed.
#
# cargo-fuzz needs nightly compiler flags: the stable toolchain takes them
# with RUSTC_BOOTSTRAP=1. The targets are built once, into fuzz/target/,
# without a sanitizer (the code they reach forbids `unsafe`) and with 16
# codegen units (fuzz/Cargo.toml sets opt-level 1): a cold build takes about
# 4 minutes on 2 cores. FUZZ_JOBS (default: the number of CPUs) targets run
# at once.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${FUZZ_SECONDS:-30}
input_timeout=${FUZZ_INPUT_TIMEOUT:-10}
jobs=${FUZZ_JOBS:-$(nproc)}
export RUSTC_BOOTSTRAP=1
build_flags=(--sanitizer none --codegen-units 16)

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (cargo install --locked cargo-fuzz)" >&2
  cargo install --locked cargo-fuzz
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

start=$SECONDS
cargo fuzz build "${build_flags[@]}"
echo "built the fuzz targets in $((SECONDS - start)) s" >&2

scratch=$(mktemp -d "${TMPDIR:-/tmp}/runlease-fuzz.XXXXXX")
cleanup() {
  if [ "${FUZZ_KEEP:-0}" = 1 ]; then
    echo "new corpus inputs kept in $scratch" >&2
  else
    rm -rf "$scratch"
  fi
}
trap cleanup EXIT

# One target: new inputs into $scratch/corpus/<target>, the committed corpus
# read as a second directory, its output into $scratch/<target>.log.
run_one() {
  local target=$1
  mkdir -p "$scratch/corpus/$target" "artifacts/$target"
  cargo fuzz run "${build_flags[@]}" "$target" "$scratch/corpus/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -timeout="$input_timeout" -rss_limit_mb=2048 \
    -print_final_stats=1 >"$scratch/$target.log" 2>&1
}

failed=()
declare -A running=()
# Waits for one running target (bash 5.1's `wait -n -p`) and reports it.
reap() {
  local pid status=0
  wait -n -p pid "${!running[@]}" || status=$?
  local target=${running[$pid]}
  unset "running[$pid]"
  if [ "$status" -eq 0 ]; then
    printf '%-14s ok   %s\n' "$target" "$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$scratch/$target.log" | grep -o '[0-9]*$') runs"
  else
    printf '%-14s FAILED\n' "$target"
    # The panic (or libFuzzer's verdict: a timeout, out of memory) and
    # cargo-fuzz's summary: the input, and the commands that replay it.
    sed -n -e '/panicked at/,/^stack backtrace/p' -e '/ERROR: libFuzzer/,+2p' \
      -e '/^Failing input:/,/^Minimize/p' "$scratch/$target.log" | grep -v '^stack backtrace'
    failed+=("$target")
  fi
}
start=$SECONDS
for target in "${targets[@]}"; do
  while [ "${#running[@]}" -ge "$jobs" ]; do
    reap
  done
  run_one "$target" &
  running[$!]=$target
done
while [ "${#running[@]}" -gt 0 ]; do
  reap
done
echo "fuzzed ${#targets[@]} targets for ${seconds} s each in $((SECONDS - start)) s" >&2

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz targets that crashed: ${failed[*]}" >&2
  echo "replay an input: (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run ${build_flags[*]} TARGET artifacts/TARGET/<file>)" >&2
  exit 1
fi
