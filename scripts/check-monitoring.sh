#!/usr/bin/env bash
# Checks of the monitoring files:
# - infra/prometheus/alerts.yml with `promtool check rules`, and its unit
#   tests (infra/prometheus/alerts_test.yml) with `promtool test rules`;
#   promtool comes from Debian's `prometheus` package (installed with apt-get
#   when missing);
# - infra/grafana/runlease.json: valid JSON, a Grafana dashboard whose panels
#   query Prometheus through the `datasource` variable, with a `queue`
#   variable;
# - every metric name the rules, their tests and the dashboard use is one a
#   live coordinator serves: a debug coordinator is started on a fresh
#   PostgreSQL database, made to enqueue, claim, complete and fail a few
#   jobs, and its GET /metrics is read. Families are taken from its
#   `# TYPE name type` lines (declared even before their first sample), so
#   a counter `name` is queried as `name_total`, a histogram as
#   `name_bucket`, `name_sum` or `name_count`, a gauge as `name`.
# - a self-test: the name extraction must find a made-up name in PromQL.
#
# Needs PostgreSQL on 127.0.0.1:5432 (trust, user postgres; override with
# RUNLEASE_TEST_DATABASE_URL), python3 (standard library only), curl, psql
# and cargo. Redis is not used (RUNLEASE_REDIS_URL is empty). Any problem
# exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
# shellcheck source=scripts/live-coordinator.sh
source scripts/live-coordinator.sh

rules=infra/prometheus/alerts.yml
rule_tests=infra/prometheus/alerts_test.yml
dashboard=infra/grafana/runlease.json

for tool in psql curl python3 cargo; do
  command -v "$tool" >/dev/null || { echo "check-monitoring.sh needs $tool on PATH" >&2; exit 1; }
done

if ! command -v promtool >/dev/null; then
  echo "== installing promtool (Debian package prometheus)"
  sudo=()
  [[ $(id -u) -eq 0 ]] || sudo=(sudo)
  if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends prometheus >/dev/null; then
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends prometheus >/dev/null
  fi
  command -v promtool >/dev/null || { echo "prometheus was installed but promtool is not on PATH" >&2; exit 1; }
fi

# The metric-name checker (standard library only). Modes:
#   names FILE...          metric names FILE uses (PromQL in `expr:` and
#                          test `series:` of YAML rule files, `expr` and
#                          variable queries of a dashboard), one per line
#   dashboard FILE         structural checks of the Grafana dashboard
#   served METRICS_TEXT    names a /metrics answer serves, one per line
#   compare SERVED FILE... fail listing used names that are not served
#   self-test              the PromQL name extraction on tricky cases
read -r -d '' checker <<'PY' || true
import json
import re
import sys

KEYWORDS = {
    # binary and set operators, modifiers
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
    "group_right", "offset", "bool", "atan2",
    # aggregation operators (they may be followed by `by (...)`, not `(`)
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count",
    "count_values", "bottomk", "topk", "quantile", "limitk", "limit_ratio",
    # number literals
    "inf", "nan",
}
LABEL_LIST_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
IGNORED_NAMES = {"up"}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
NUMBER = re.compile(r"(0[xX][0-9a-fA-F]+|(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?([a-zA-Z]+\d*)*)")
GRAFANA_VAR = re.compile(r"\$(\{[^}]*\}|\w+)")


def skip_string(expr, i):
    quote = expr[i]
    i += 1
    while i < len(expr) and expr[i] != quote:
        i += 2 if expr[i] == "\\" and quote != "`" else 1
    return i + 1


def skip_group(expr, i, open_, close):
    depth = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = skip_string(expr, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_!r} in {expr!r}")


def metric_names(expr):
    """Metric names a PromQL expression selects (functions, keywords, label
    names and strings left out; Grafana variables dropped first)."""
    expr = GRAFANA_VAR.sub("1", expr)
    names = set()
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c == "#":
            end = expr.find("\n", i)
            i = len(expr) if end < 0 else end
        elif c in "\"'`":
            i = skip_string(expr, i)
        elif c == "{":
            i = skip_group(expr, i, "{", "}")
        elif c == "[":
            i = skip_group(expr, i, "[", "]")
        elif c.isdigit() or (c == "." and i + 1 < len(expr) and expr[i + 1].isdigit()):
            i = NUMBER.match(expr, i).end()
        elif IDENT.match(expr, i):
            word = IDENT.match(expr, i).group(0)
            i += len(word)
            j = i
            while j < len(expr) and expr[j].isspace():
                j += 1
            follows_paren = j < len(expr) and expr[j] == "("
            if word.lower() in LABEL_LIST_WORDS and follows_paren:
                i = skip_group(expr, j, "(", ")")  # a list of label names
            elif follows_paren or word.lower() in KEYWORDS:
                pass  # a function or an operator
            elif word not in IGNORED_NAMES:
                names.add(word)
        else:
            i += 1
    return names


def yaml_scalars(path, key):
    """Values of `key:` in a YAML file: plain or quoted on the line, or a
    block scalar (| or >) below it. Enough for rule and rule-test files."""
    lines = open(path, encoding="utf-8").read().split("\n")
    found = []
    pattern = re.compile(r"^(\s*)(?:-\s+)?" + re.escape(key) + r":\s*(.*?)\s*$")
    n = 0
    while n < len(lines):
        m = pattern.match(lines[n])
        n += 1
        if not m:
            continue
        indent, value = len(m.group(1)), m.group(2)
        if value[:1] in ("|", ">"):
            block = []
            while n < len(lines) and (not lines[n].strip() or len(lines[n]) - len(lines[n].lstrip()) > indent):
                block.append(lines[n])
                n += 1
            found.append("\n".join(block))
        elif value[:1] == "'":
            found.append(value[1:value.rindex("'")].replace("''", "'"))
        elif value[:1] == '"':
            found.append(json.loads(value[: value.rindex('"') + 1]))
        else:
            found.append(re.sub(r"\s+#.*$", "", value))
    return found


def dashboard_queries(path):
    board = json.load(open(path, encoding="utf-8"))
    queries = []

    def walk(panels):
        for panel in panels:
            for target in panel.get("targets", []):
                if target.get("expr"):
                    queries.append(target["expr"])
            walk(panel.get("panels", []))

    walk(board.get("panels", []))
    for var in board.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        m = re.fullmatch(r"\s*label_values\(\s*(.*?)\s*,\s*[A-Za-z_]\w*\s*\)\s*", query)
        if m:
            queries.append(m.group(1))  # the series selector
        elif re.fullmatch(r"\s*(label_names|metrics)\(.*\)\s*", query) is None:
            queries.append(re.sub(r"^\s*query_result\((.*)\)\s*$", r"\1", query))
    return queries


def used_names(path):
    names = {}
    if path.endswith(".json"):
        exprs = dashboard_queries(path)
    else:
        exprs = yaml_scalars(path, "expr") + yaml_scalars(path, "series")
    if not exprs:
        raise SystemExit(f"{path}: no PromQL expression found")
    for expr in exprs:
        for name in metric_names(expr):
            names.setdefault(name, expr.strip().split("\n")[0])
    return names


def served_names(text):
    served = set()
    for line in text.splitlines():
        m = re.match(r"#\s*TYPE\s+(\S+)\s+(\S+)", line)
        if m:
            family, kind = m.groups()
            if kind == "counter":
                served.update({family + "_total", family.removesuffix("_total") + "_total"})
            elif kind == "histogram":
                served.update(family + s for s in ("_bucket", "_sum", "_count"))
            elif kind == "summary":
                served.update({family, family + "_sum", family + "_count"})
            else:
                served.add(family)
        elif line and not line.startswith("#"):
            served.add(re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group(0))
    return served


def check_dashboard(path):
    board = json.load(open(path, encoding="utf-8"))
    problems = []
    if not isinstance(board.get("schemaVersion"), int) or board["schemaVersion"] < 36:
        problems.append(f"schemaVersion {board.get('schemaVersion')!r}: expected a recent one (36 or later)")
    for key in ("title", "uid", "panels", "templating"):
        if not board.get(key):
            problems.append(f"no {key}")
    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("no `datasource` variable of type datasource for Prometheus")
    queue = variables.get("queue")
    if not queue or queue.get("type") != "query" or "label_values(" not in json.dumps(queue.get("query")):
        problems.append("no `queue` variable from label_values(...)")
    ids, targets = set(), 0

    def check_ds(where, value):
        if not (isinstance(value, dict) and value.get("type") == "prometheus" and value.get("uid") in ("${datasource}", "$datasource")):
            problems.append(f"{where}: datasource {value!r} is not the ${{datasource}} variable")

    for name, var in variables.items():
        if var.get("type") == "query":
            check_ds(f"variable {name}", var.get("datasource"))

    def walk(panels):
        nonlocal targets
        for panel in panels:
            where = f"panel {panel.get('id')} {panel.get('title')!r}"
            if panel.get("id") in ids:
                problems.append(f"{where}: duplicate id")
            ids.add(panel.get("id"))
            pos = panel.get("gridPos") or {}
            if not all(isinstance(pos.get(k), int) for k in "hwxy") or pos["x"] + pos["w"] > 24:
                problems.append(f"{where}: bad gridPos {pos!r}")
            if panel.get("type") != "row":
                if not panel.get("title"):
                    problems.append(f"{where}: no title")
                check_ds(where, panel.get("datasource"))
                if not panel.get("targets"):
                    problems.append(f"{where}: no query")
                refs = [t.get("refId") for t in panel.get("targets", [])]
                if len(set(refs)) != len(refs):
                    problems.append(f"{where}: duplicate refId")
                for target in panel.get("targets", []):
                    targets += 1
                    check_ds(where, target.get("datasource"))
                    if not target.get("expr", "").strip():
                        problems.append(f"{where}: a target without expr")
                    else:
                        try:
                            metric_names(target["expr"])
                        except ValueError as e:
                            problems.append(f"{where}: {e}")
            walk(panel.get("panels", []))

    walk(board.get("panels", []))
    if problems:
        raise SystemExit(f"{path}:\n  " + "\n  ".join(problems))
    print(f"{path}: {len(ids)} panels, {targets} queries, variables {', '.join(variables)}")


def self_test():
    cases = {
        'sum by (queue) (rate(runlease_a_total{queue=~"x|y", state!="by"}[5m] offset 1h)) > 0.5e3': {"runlease_a_total"},
        'histogram_quantile(0.99, sum(rate(runlease_h_bucket{route!~"/v1/jobs/\\\\{id\\\\}"}[5m])) by (le, route))': {"runlease_h_bucket"},
        'max by (queue) (runlease_d{state="q"}) > 0 and on() sum(runlease_w) == 0': {"runlease_d", "runlease_w"},
        'a / on(instance) group_left(version) b unless ignoring (x) c or bool d': {"a", "b", "c", "d"},
        'up{job="runlease"} == 0 or absent(runlease_x)': {"runlease_x"},
        'max_over_time(runlease_p[$__rate_interval]) - ${other} * $var + inf': {"runlease_p"},
        'sum(rate(runlease_typo_totl{queue=~"$queue"}[1m30s]))': {"runlease_typo_totl"},
        'topk(5, count_values("v", runlease_v)) # a comment naming runlease_not': {"runlease_v"},
    }
    for expr, want in cases.items():
        got = metric_names(expr)
        if got != want:
            raise SystemExit(f"self-test: {expr!r}: found {sorted(got)}, expected {sorted(want)}")
    served = served_names("# TYPE runlease_c counter\n# TYPE runlease_h histogram\n# TYPE runlease_g gauge\nrunlease_g 1\n# EOF\n")
    assert {"runlease_c_total", "runlease_h_bucket", "runlease_h_count", "runlease_g"} <= served, served
    assert not {"runlease_c", "runlease_h"} & served, served
    print(f"self-test: name extraction right on {len(cases)} expressions")


mode, args = sys.argv[1], sys.argv[2:]
if mode == "names":
    for path in args:
        for name in sorted(used_names(path)):
            print(name)
elif mode == "dashboard":
    check_dashboard(args[0])
elif mode == "served":
    for name in sorted(served_names(open(args[0], encoding="utf-8").read())):
        print(name)
elif mode == "compare":
    served = set(open(args[0], encoding="utf-8").read().split())
    missing = []
    total = set()
    for path in args[1:]:
        names = used_names(path)
        total |= set(names)
        missing += [f"{path}: {name}   (in: {expr})" for name, expr in sorted(names.items()) if name not in served]
    if missing:
        raise SystemExit("metric names used but not served by the coordinator:\n  " + "\n  ".join(missing))
    print(f"all {len(total)} metric names used in {', '.join(args[1:])} are served")
elif mode == "self-test":
    self_test()
else:
    raise SystemExit(f"unknown mode {mode}")
PY
check() { python3 -c "$checker" "$@"; }

echo "== promtool $(promtool --version 2>&1 | awk 'NR==1 {print $3}'): check rules"
promtool check rules "$rules"
echo "== promtool: unit tests of the rules"
promtool test rules "$rule_tests"

echo "== Grafana dashboard $dashboard"
check dashboard "$dashboard"
check self-test

echo "== building the debug coordinator"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build --quiet -p runlease-coordinator --bin runlease-coordinator
binary="$target/debug/runlease-coordinator"

work="$target/check-monitoring"
rm -rf "$work"
mkdir -p "$work"
log="$work/coordinator.log"
db_name=runlease_check_monitoring
admin_url="${RUNLEASE_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
server_url="${admin_url%/*}/$db_name"

echo "== fresh database $db_name"
PGOPTIONS="-c client_min_messages=warning" psql "$admin_url" -v ON_ERROR_STOP=1 -q \
  -c "DROP DATABASE IF EXISTS $db_name WITH (FORCE)"

port="$(free_port)"
base="http://127.0.0.1:$port"
echo "== starting the coordinator on $base (log: $log)"
start_coordinator "$binary" "$log" \
  RUNLEASE_DATABASE_URL="$server_url" \
  RUNLEASE_LISTEN="127.0.0.1:$port" \
  RUNLEASE_SECRET="check-monitoring-secret-0123456789abcdef" \
  RUNLEASE_REDIS_URL="" \
  RUNLEASE_REAPER_INTERVAL_MS=1000 \
  RUNLEASE_SHUTDOWN_GRACE_MS=2000
wait_ready "$base" 30

echo "== exercising it: enqueue, claim, heartbeat, complete, fail, a late call, a forged token"
api() { # METHOD PATH [BODY]: the answer's body; any status but 2xx fails
  curl -fsS -X "$1" "$base$2" -H 'Content-Type: application/json' ${3:+-d "$3"}
}
field() { # KEY...: a field of the JSON on stdin (list indexes as numbers)
  python3 -c '
import json, sys
value = json.load(sys.stdin)
for key in sys.argv[1:]:
    value = value[int(key)] if isinstance(value, list) else value[key]
print(value)' "$@"
}
queue=monitoring-check
api POST /v1/jobs "{\"queue\": \"$queue\", \"payload\": {\"n\": 1}}" >/dev/null
api POST /v1/jobs/batch "{\"jobs\": [{\"queue\": \"$queue\", \"payload\": {\"n\": 2}}, {\"queue\": \"$queue\", \"payload\": {\"n\": 3}, \"delay_ms\": 3600000}]}" >/dev/null
claim="$(api POST /v1/claim "{\"queues\": [\"$queue\"], \"worker_id\": \"check-monitoring\", \"max_jobs\": 2}")"
first="$(field leases 0 lease_token <<<"$claim")"
second="$(field leases 1 lease_token <<<"$claim")"
api POST /v1/heartbeat "{\"leases\": [{\"lease_token\": \"$first\"}]}" >/dev/null
api POST /v1/complete "{\"lease_token\": \"$first\", \"result\": {\"ok\": true}}" >/dev/null
api POST /v1/fail "{\"lease_token\": \"$second\", \"error\": \"check-monitoring\", \"retryable\": false}" >/dev/null
# A heartbeat on a finished lease (per-item lease_lost), a forged token (409),
# a claim on the empty queue (a short long-poll), a read of a missing job (404).
api POST /v1/heartbeat "{\"leases\": [{\"lease_token\": \"$first\"}]}" >/dev/null
curl -sS -o /dev/null -X POST "$base/v1/complete" -H 'Content-Type: application/json' \
  -d "{\"lease_token\": \"${first%?}x\", \"result\": {}}"
api POST /v1/claim "{\"queues\": [\"$queue\"], \"worker_id\": \"check-monitoring\", \"max_jobs\": 1, \"wait_ms\": 50}" >/dev/null
curl -sS -o /dev/null "$base/v1/jobs/00000000-0000-0000-0000-000000000000"

curl -fsS "$base/metrics" >"$work/metrics.txt"
stop_coordinator
trap - EXIT
no_panic "while it was exercised" || exit 1

check served "$work/metrics.txt" >"$work/served.txt"
families="$(grep -c '^# TYPE ' "$work/metrics.txt" || true)"
empty="$(python3 - "$work/metrics.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
families = re.findall(r"^# TYPE (\S+) ", text, re.M)
samples = {re.match(r"[^{\s]+", l).group(0) for l in text.splitlines() if l and not l.startswith("#")}
print(" ".join(f for f in families if not any(s == f or s.startswith(f + "_") for s in samples)))
PY
)"
echo "/metrics: $families families declared with # TYPE; without samples yet (declared all the same): ${empty:-none}"
for family in runlease_jobs_enqueued runlease_jobs_claimed runlease_jobs_completed runlease_jobs_failed \
  runlease_request_duration_seconds runlease_queue_depth runlease_db_timeouts runlease_sqs_send_failures; do
  grep -q "^# TYPE $family " "$work/metrics.txt" || { echo "/metrics declares no $family: see $work/metrics.txt" >&2; exit 1; }
done
grep -q "^runlease_jobs_completed_total{queue=\"$queue\"} 1" "$work/metrics.txt" || {
  echo "the exercise did not show in /metrics (no completed job on $queue): see $work/metrics.txt" >&2
  exit 1
}

echo "== metric names in the rules, their tests and the dashboard against /metrics"
check compare "$work/served.txt" "$rules" "$rule_tests" "$dashboard"
# Self-test: a rule over a name the coordinator does not serve must be refused.
sed 's/runlease_reaper_errors_total/runlease_reaper_error_total/' "$rules" >"$work/broken-alerts.yml"
if check compare "$work/served.txt" "$work/broken-alerts.yml" >/dev/null 2>&1; then
  echo "a rule over runlease_reaper_error_total (not served) was accepted: the check has no teeth" >&2
  exit 1
fi
echo "self-test: a rule over a name not served is refused"
echo "monitoring: all checks passed"
