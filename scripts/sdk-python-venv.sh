#!/usr/bin/env bash
# Makes the Python library's test environment: a virtual environment made
# from sdk/python's own metadata (`pip install 'sdk/python[test]'`, so a
# dependency missing from pyproject.toml fails the tests), made again from
# nothing whenever pyproject.toml changes (a copy of it in the environment is
# the stamp); the package itself is reinstalled from the working tree when its
# sources changed. One caller at a time (flock). Used by scripts/test and by
# the tests (tests/tests/e2e/sdk_python.rs) when run alone.
#
#   bash scripts/sdk-python-venv.sh [VENV]   (default: ${CARGO_TARGET_DIR:-target}/sdk-python-venv)
set -euo pipefail
cd "$(dirname "$0")/.."
sdk="$PWD/sdk/python"
venv="${1:-${CARGO_TARGET_DIR:-$PWD/target}/sdk-python-venv}"
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
stamp="$venv/.runlease-pyproject"
if ! cmp -s "$sdk/pyproject.toml" "$stamp"; then
  echo "the Python library's test environment is missing or stale: python3 -m venv, pip install '.[test]'" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$sdk[test]"
  cp "$sdk/pyproject.toml" "$stamp"
fi
# The package itself, again whenever its sources changed (their digest is the
# stamp): never while another test may be starting a Python from this
# environment, unless the sources really changed under it.
digest="$(cd "$sdk" && find pyproject.toml README.md src -type f ! -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum | sha256sum)"
if [ "$digest" != "$(cat "$venv/.runlease-src" 2>/dev/null)" ]; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$sdk"
  echo "$digest" > "$venv/.runlease-src"
fi
