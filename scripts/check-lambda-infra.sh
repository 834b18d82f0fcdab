#!/usr/bin/env bash
# Lints the Lambda stack (infra/lambda/template.yaml, SAM) with cfn-lint
# (pinned in scripts/requirements-ci.txt, installed by scripts/pytools.sh),
# offline, then checks the stack's own invariants. Fails on errors (and when cfn-lint itself fails); warnings and
# informational findings are printed but do not fail.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/pytools.sh
source scripts/pytools.sh
command -v python3 >/dev/null || { echo "check-lambda-infra.sh needs python3" >&2; exit 1; }
pytools_setup

template=infra/lambda/template.yaml
set +e
"$PYTOOLS/cfn-lint" --format parseable "$template"
rc=$?
set -e
# cfn-lint's exit status is a bit set: 1 the linter failed, 2 errors,
# 4 warnings, 8 informational.
if (( rc & 3 )); then
  echo "cfn-lint found errors in $template (exit status $rc)" >&2
  exit 1
fi

# What cfn-lint cannot know: the stack's own invariants.
"$PYTOOLS/python" - "$template" <<'PY'
import sys
from cfnlint.decode import cfn_yaml

t = cfn_yaml.load(sys.argv[1])
res, params = t["Resources"], t["Parameters"]
errors = []
rows = t["Mappings"]["VisibilityTimeout"]
for timeout in params["FunctionTimeout"]["AllowedValues"]:
    row = rows.get(str(timeout))
    if row is None or int(row["Seconds"]) < 6 * int(timeout):
        errors.append(f"FunctionTimeout {timeout}: the wake-up queue's visibility timeout must be at least {6 * int(timeout)} s")
queue = res["WakeQueue"]["Properties"]
if "RedrivePolicy" not in queue:
    errors.append("WakeQueue has no RedrivePolicy (dead-letter queue)")
events = res["WorkerFunction"]["Properties"]["Events"]
sqs = [e["Properties"] for e in events.values() if e["Type"] == "SQS"]
if not sqs or any("ReportBatchItemFailures" not in e.get("FunctionResponseTypes", []) for e in sqs):
    errors.append("the SQS event source must report batch item failures")
if not any(e["Type"] == "Schedule" for e in events.values()):
    errors.append("no EventBridge schedule (sweep)")
if "Role" not in res["WorkerFunction"]["Properties"]:
    errors.append("WorkerFunction must use the explicit least-privilege WorkerRole")
for e in errors:
    print(f"{sys.argv[1]}: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
PY

echo "ok: $template passes cfn-lint $("$PYTOOLS/cfn-lint" --version | awk '{print $2}')$( (( rc & 12 )) && echo ' (with warnings above)')"
