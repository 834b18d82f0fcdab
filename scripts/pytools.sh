# Sourced by the CI check scripts: a virtualenv holding scripts/requirements-ci.txt.
# Sets PYTOOLS (the virtualenv's bin directory). The virtualenv lives beside
# the cargo target directory (RUNLEASE_PYTOOLS overrides it) and is rebuilt
# when the requirements change.
# shellcheck shell=bash

pytools_setup() {
  local root requirements venv stamp wanted
  root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  requirements="$root/scripts/requirements-ci.txt"
  venv="${RUNLEASE_PYTOOLS:-${CARGO_TARGET_DIR:-$root/target}/pytools}"
  stamp="$venv/.requirements.sha256"
  wanted="$(sha256sum "$requirements" | cut -d' ' -f1)"
  if [[ ! -x "$venv/bin/python" || ! -f "$stamp" || "$(cat "$stamp")" != "$wanted" ]]; then
    echo "installing the CI's Python tools into $venv (scripts/requirements-ci.txt)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    echo "$wanted" >"$stamp"
  fi
  PYTOOLS="$venv/bin"
  export PYTOOLS
}
