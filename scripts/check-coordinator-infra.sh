#!/usr/bin/env bash
# Lints the coordinator stack (infra/coordinator/template.yaml: ECS on
# Fargate behind an ALB) with cfn-lint (pinned in scripts/requirements-ci.txt,
# installed by scripts/pytools.sh), offline, then checks what cfn-lint cannot
# know: the stack's own invariants, and that every RUNLEASE_* name the
# template and docs/deploy-coordinator.md use is a coordinator setting (an
# `env = "RUNLEASE_..."` under coordinator/src). Fails on errors (and when
# cfn-lint itself fails); warnings and informational findings are printed but do not fail.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/pytools.sh
source scripts/pytools.sh
command -v python3 >/dev/null || { echo "check-coordinator-infra.sh needs python3" >&2; exit 1; }
pytools_setup

template=infra/coordinator/template.yaml
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

"$PYTOOLS/python" - "$template" coordinator/src docs/deploy-coordinator.md <<'PY'
import pathlib
import re
import sys
from cfnlint.decode import cfn_yaml

path, config_rs, doc = sys.argv[1:4]
t = cfn_yaml.load(path)
res, params, maps = t["Resources"], t["Parameters"], t["Mappings"]
errors = []

def ref(value, name):
    return isinstance(value, dict) and value.get("Ref") == name

# The longest long-poll: wait_ms up to 60000 (docs/protocol.md).
LONGEST_WAIT_S = 60
MIN_IDLE_S = 75

# Idle timeout above the longest long-poll.
idle = params["IdleTimeoutSeconds"]
if int(idle["MinValue"]) < MIN_IDLE_S or int(idle["Default"]) < MIN_IDLE_S:
    errors.append(f"IdleTimeoutSeconds must be at least {MIN_IDLE_S} (MinValue and Default)")
lb = res["LoadBalancer"]["Properties"]
attrs = {a["Key"]: a["Value"] for a in lb.get("LoadBalancerAttributes", [])}
if not ref(attrs.get("idle_timeout.timeout_seconds"), "IdleTimeoutSeconds"):
    errors.append("the load balancer's idle_timeout.timeout_seconds must be IdleTimeoutSeconds")
if lb.get("Type") != "application":
    errors.append("the load balancer must be an application load balancer")

# TLS at the load balancer, and nothing in plain HTTP.
listeners = {k: r["Properties"] for k, r in res.items() if r["Type"] == "AWS::ElasticLoadBalancingV2::Listener"}
for name, listener in listeners.items():
    if listener.get("Protocol") != "HTTPS" or not listener.get("Certificates"):
        errors.append(f"{name}: every listener must be HTTPS with a certificate")

# Readiness as target health, on the container's port.
tg = res["TargetGroup"]["Properties"]
if tg.get("HealthCheckPath") != "/readyz":
    errors.append("the target group's health check must be /readyz")
if tg.get("TargetType") != "ip" or str(tg.get("Port")) != "8080":
    errors.append("the target group must send to the tasks' IPs on port 8080")
tg_attrs = {a["Key"]: a["Value"] for a in tg.get("TargetGroupAttributes", [])}
if not ref(tg_attrs.get("deregistration_delay.timeout_seconds"), "DeregistrationDelaySeconds"):
    errors.append("deregistration_delay.timeout_seconds must be DeregistrationDelaySeconds")
if int(params["DeregistrationDelaySeconds"]["Default"]) <= LONGEST_WAIT_S:
    errors.append(f"DeregistrationDelaySeconds must default above {LONGEST_WAIT_S} s (the longest long-poll)")

# /metrics is not served through the load balancer.
rules = [r["Properties"] for r in res.values() if r["Type"] == "AWS::ElasticLoadBalancingV2::ListenerRule"]
if not any(
    "/metrics" in c.get("PathPatternConfig", {}).get("Values", [])
    and all(a["Type"] == "fixed-response" for a in r["Actions"])
    for r in rules for c in r["Conditions"]
):
    errors.append("no listener rule keeps /metrics (unauthenticated) off the load balancer")

# The container.
task = res["TaskDefinition"]["Properties"]
(container,) = task["ContainerDefinitions"]
env = {}
for item in container.get("Environment", []):
    if isinstance(item, dict) and "Fn::If" in item:
        item = item["Fn::If"][1]
    if isinstance(item, dict) and "Name" in item:
        env[item["Name"]] = item["Value"]
secrets = {s["Name"]: s["ValueFrom"] for s in container.get("Secrets", [])}
if env.get("RUNLEASE_LISTEN") != "0.0.0.0:8080":
    errors.append("RUNLEASE_LISTEN must be 0.0.0.0:8080")
# The coordinator's idle timeout above the load balancer's, and within
# what the coordinator accepts.
if env.get("RUNLEASE_IDLE_TIMEOUT_MS") != {"Fn::Sub": "${IdleTimeoutSeconds}999"}:
    errors.append("RUNLEASE_IDLE_TIMEOUT_MS must be the load balancer's idle timeout plus 999 ms")
limits_rs = (pathlib.Path(config_rs) / "limits.rs").read_text()
idle_max = re.search(r'env = "RUNLEASE_IDLE_TIMEOUT_MS".*?range\(\d+\.\.=([\d_]+)\)', limits_rs, re.S)
if idle_max is None:
    errors.append("the range of RUNLEASE_IDLE_TIMEOUT_MS was not found in limits.rs")
elif int(params["IdleTimeoutSeconds"]["MaxValue"]) * 1000 + 999 > int(idle_max.group(1).replace("_", "")):
    errors.append("IdleTimeoutSeconds' MaxValue plus 999 ms must stay within RUNLEASE_IDLE_TIMEOUT_MS's range")
if [p.get("ContainerPort") for p in container.get("PortMappings", [])] != [8080]:
    errors.append("the container must map port 8080 only")
wanted_secrets = {
    "RUNLEASE_DATABASE_URL": "DatabaseUrlSecretArn",
    "RUNLEASE_SECRET": "RunleaseSecretArn",
    "RUNLEASE_API_KEYS": "ApiKeysSecretArn",
}
for name, param in wanted_secrets.items():
    if not ref(secrets.get(name), param):
        errors.append(f"{name} must be injected from the secret {param}")
    if name in env:
        errors.append(f"{name} must not be a plain environment variable")
if "/healthz" not in " ".join(map(str, container.get("HealthCheck", {}).get("Command", []))):
    errors.append("the container's health check (liveness) must call /healthz")
if container.get("LogConfiguration", {}).get("LogDriver") != "awslogs":
    errors.append("the container must log to CloudWatch (awslogs)")

# Redis over TLS (rediss://) is accepted beside redis://, and empty.
redis_url = params["RedisUrl"]
for url in ("", "redis://r.example:6379", "rediss://master.r.example:6379", "rediss://r.example:6380/0"):
    if not re.fullmatch(redis_url["AllowedPattern"], url):
        errors.append(f"RedisUrl must accept {url!r}")
for url in ("http://r.example:6379", "rediss://"):
    if re.fullmatch(redis_url["AllowedPattern"], url):
        errors.append(f"RedisUrl must refuse {url!r}")
if not ref(env.get("RUNLEASE_REDIS_URL"), "RedisUrl"):
    errors.append("RUNLEASE_REDIS_URL must be the RedisUrl parameter")

# Shutdown: ECS's stop timeout above RUNLEASE_SHUTDOWN_GRACE_MS.
if not ref(container.get("StopTimeout"), "StopTimeout"):
    errors.append("the container's StopTimeout must be the StopTimeout parameter")
if env.get("RUNLEASE_SHUTDOWN_GRACE_MS") != {"Fn::FindInMap": ["StopTimeout", {"Ref": "StopTimeout"}, "ShutdownGraceMs"]}:
    errors.append("RUNLEASE_SHUTDOWN_GRACE_MS must come from the StopTimeout mapping")
for stop in params["StopTimeout"]["AllowedValues"]:
    row = maps["StopTimeout"].get(str(stop))
    if row is None or int(row["ShutdownGraceMs"]) >= int(stop) * 1000:
        errors.append(f"StopTimeout {stop}: the shutdown grace must be below {int(stop) * 1000} ms")
    elif int(stop) > 120:
        errors.append(f"StopTimeout {stop}: Fargate allows at most 120 s")

# The database deadline below the load balancer's.
if int(params["DatabaseCallTimeoutMs"]["MaxValue"]) >= int(idle["MinValue"]) * 1000:
    errors.append("DatabaseCallTimeoutMs must stay below the load balancer's idle timeout")

# The execution role reads exactly the three secrets, and nothing else does.
role = res["ExecutionRole"]["Properties"]
secret_refs = sorted(wanted_secrets.values())
granted = []
for policy in role["Policies"]:
    for st in policy["PolicyDocument"]["Statement"]:
        if isinstance(st, dict) and "Fn::If" in st:
            st = st["Fn::If"][1]
        if not isinstance(st, dict):
            continue
        actions = st["Action"] if isinstance(st["Action"], list) else [st["Action"]]
        if any(a.startswith("secretsmanager:") for a in actions):
            if actions != ["secretsmanager:GetSecretValue"]:
                errors.append(f"the execution role may only GetSecretValue, not {actions}")
            resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
            granted += [r.get("Ref") if isinstance(r, dict) else r for r in resources]
if sorted(granted) != secret_refs:
    errors.append(f"the execution role must read exactly {secret_refs}, not {sorted(granted)}")
for name, r in res.items():
    if r["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy") or (
        name != "ExecutionRole" and r["Type"] == "AWS::IAM::Role" and r["Properties"].get("Policies")
    ):
        errors.append(f"{name}: only the execution role has inline policies")

# Every RUNLEASE_* name is a coordinator setting (the doc may also name the
# CLI's and workers' own variables).
settings = set()
for rs in pathlib.Path(config_rs).rglob("*.rs"):
    settings |= set(re.findall(r'env = "(RUNLEASE_[A-Z0-9_]+)"', rs.read_text()))
if len(settings) < 30:
    errors.append(f"{config_rs}: found only {len(settings)} settings; has the format changed?")
for name in sorted(set(env) | set(secrets)):
    if name.startswith("RUNLEASE_") and name not in settings:
        errors.append(f"{path}: {name} is not a setting of {config_rs}")
client_side = {"RUNLEASE_URL", "RUNLEASE_KEY"}
for name in sorted(set(re.findall(r"\bRUNLEASE_[A-Z0-9_]*[A-Z0-9]\b", open(doc).read()))):
    if name not in settings and name not in client_side:
        errors.append(f"{doc}: {name} is not a setting of {config_rs}")

for e in errors:
    print(f"{path}: {e}", file=sys.stderr)
sys.exit(1 if errors else 0)
PY

echo "ok: $template passes cfn-lint $("$PYTOOLS/cfn-lint" --version | awk '{print $2}') and its invariants$( (( rc & 12 )) && echo ' (with warnings above)')"
