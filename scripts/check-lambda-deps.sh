#!/usr/bin/env bash
# The Lambda worker must not pull a database crate or OpenSSL into its build
# (worker-lambda never talks to PostgreSQL; TLS is rustls through
# runlease-client). Fails, naming the crates, when one appears in the normal
# (non-dev, non-build) dependency tree of runlease-worker-lambda, on the
# host or either Lambda architecture. An argument checks another package
# instead (to see the check fail: scripts/check-lambda-deps.sh runlease-coordinator).
set -euo pipefail
cd "$(dirname "$0")/.."

package=${1:-runlease-worker-lambda}

forbidden='^(tokio-postgres|postgres|postgres-native-tls|postgres-protocol|deadpool-postgres|sqlx|diesel|openssl|openssl-sys|native-tls)$'
status=0
for target in host x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
  if [ "$target" = host ]; then target_args=(); else target_args=(--target "$target"); fi
  tree=$(cargo tree -p "$package" -e normal --prefix none --format '{p}' "${target_args[@]}")
  found=$(printf '%s\n' "$tree" | awk '{print $1}' | sort -u | grep -E "$forbidden" || true)
  if [ -n "$found" ]; then
    echo "$package ($target) depends on forbidden crates:" >&2
    printf '  %s\n' $found >&2
    echo "Find who pulls them in: cargo tree -p $package -e normal -i <crate> --target <triple>" >&2
    status=1
  else
    echo "$package ($target): $(printf '%s\n' "$tree" | awk '{print $1}' | sort -u | wc -l) crates, no database crate, no OpenSSL"
  fi
done
exit "$status"
