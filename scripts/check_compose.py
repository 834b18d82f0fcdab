"""Checks infra/docker-compose.yml: against the Compose specification's JSON
schema, then for what the schema cannot see (references between services,
files the compose file mounts or builds from, the coordinator's settings).

    python check_compose.py SCHEMA.json COMPOSE.yml
    python check_compose.py --self-test SCHEMA.json COMPOSE.yml

--self-test breaks a copy of the compose file in a few typical ways and
fails unless every broken copy is refused: the check must have teeth.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import jsonschema
import yaml


def problems(schema: dict, compose: dict, base: Path) -> list[str]:
    found = []
    # The schema names draft 2019-09 by a URI jsonschema does not know; say it outright.
    jsonschema.Draft201909Validator.check_schema(schema)
    validator = jsonschema.Draft201909Validator(schema)
    for error in sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path)):
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        found.append(f"schema: {where}: {error.message}")
    services = compose.get("services") or {}
    if not isinstance(services, dict):
        return found
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        depends = service.get("depends_on") or {}
        for dep in depends if isinstance(depends, (dict, list)) else []:
            if dep not in services:
                found.append(f"services/{name}/depends_on: no service named {dep!r}")
        if isinstance(depends, dict):
            for dep, cond in depends.items():
                target = services.get(dep) or {}
                if (
                    isinstance(cond, dict)
                    and cond.get("condition") == "service_healthy"
                    and "healthcheck" not in target
                ):
                    found.append(f"services/{name}/depends_on/{dep}: service_healthy, but {dep} has no healthcheck")
        build = service.get("build")
        if isinstance(build, dict):
            context = base / build.get("context", ".")
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            if not dockerfile.is_file():
                found.append(f"services/{name}/build: {dockerfile} does not exist")
        for volume in service.get("volumes") or []:
            if isinstance(volume, str) and volume.startswith((".", "/")):
                source = volume.split(":", 1)[0]
                if not (base / source).exists():
                    found.append(f"services/{name}/volumes: {source} does not exist")
    coordinator = services.get("coordinator")
    if not isinstance(coordinator, dict):
        found.append("services: no coordinator service")
    else:
        env = coordinator.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env if "=" in item)
        for setting in ("RUNLEASE_DATABASE_URL", "RUNLEASE_LISTEN", "RUNLEASE_API_KEYS", "RUNLEASE_SECRET"):
            if not env.get(setting):
                found.append(f"services/coordinator/environment: {setting} is not set")
        # `${RUNLEASE_SECRET:-default}`: the default is what a laptop runs
        # with, and the coordinator refuses a key under 32 bytes.
        secret = str(env.get("RUNLEASE_SECRET", ""))
        if secret.startswith("${RUNLEASE_SECRET:-") and secret.endswith("}"):
            secret = secret[len("${RUNLEASE_SECRET:-") : -1]
        if secret and not secret.startswith("$") and any(len(k.strip().encode()) < 32 for k in secret.split(",")):
            found.append("services/coordinator/environment: every RUNLEASE_SECRET key must be at least 32 bytes")
        listen = str(env.get("RUNLEASE_LISTEN", ""))
        if listen and not listen.startswith(("127.", "[::1]")) and not env.get("RUNLEASE_API_KEYS"):
            found.append("services/coordinator: listening beyond loopback needs RUNLEASE_API_KEYS")
    return found


def breakages(compose: dict) -> list[tuple[str, dict]]:
    """Broken copies of `compose`, each with what was broken."""
    out = []

    def broken(what: str, change) -> None:
        doc = copy.deepcopy(compose)
        change(doc["services"])
        out.append((what, doc))

    broken(
        "a misspelt key (depend_on)", lambda s: s["coordinator"].update(depend_on=s["coordinator"].pop("depends_on"))
    )
    broken("an unknown condition", lambda s: s["worker"]["depends_on"]["coordinator"].update(condition="service_ready"))
    broken("a healthcheck with a misspelt field", lambda s: s["redis"]["healthcheck"].update(intervall="2s"))
    broken(
        "a depends_on naming no service",
        lambda s: s["coordinator"]["depends_on"].update(postgress=s["coordinator"]["depends_on"].pop("postgres")),
    )
    broken("ports of the wrong type", lambda s: s["coordinator"].update(ports=8080))
    broken("the API keys left out", lambda s: s["coordinator"]["environment"].pop("RUNLEASE_API_KEYS"))
    broken(
        "a lease-token secret under 32 bytes",
        lambda s: s["coordinator"]["environment"].update(RUNLEASE_SECRET="${RUNLEASE_SECRET:-dev-secret}"),
    )
    broken(
        "a Dockerfile path that does not exist",
        lambda s: s["coordinator"]["build"].update(dockerfile="infra/Dockerfil"),
    )
    return out


def main(argv: list[str]) -> int:
    self_test = argv[:1] == ["--self-test"]
    if self_test:
        argv = argv[1:]
    schema_path, compose_path = Path(argv[0]), Path(argv[1])
    schema = json.loads(schema_path.read_text())
    compose = yaml.safe_load(compose_path.read_text())
    base = compose_path.resolve().parent
    found = problems(schema, compose, base)
    if found:
        print(f"{compose_path}: {len(found)} problem(s):", file=sys.stderr)
        for p in found:
            print(f"  {p}", file=sys.stderr)
        return 1
    if not self_test:
        print(f"{compose_path}: valid against {schema.get('title', schema_path.name)} and consistent")
        return 0
    missed = [what for what, doc in breakages(compose) if not problems(schema, doc, base)]
    if missed:
        print("the compose check let these breakages through:", file=sys.stderr)
        for what in missed:
            print(f"  {what}", file=sys.stderr)
        return 1
    print(f"self-test: every one of {len(breakages(compose))} broken copies of {compose_path} was refused")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
