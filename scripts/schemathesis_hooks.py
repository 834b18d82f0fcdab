"""Schemathesis hooks for scripts/schemathesis.sh.

Two changes to the generated requests, both so the run reaches more of the
coordinator, not less:

- Real leases and jobs. A lease token schemathesis makes up is malformed (400)
  or forged (409) and never reaches PostgreSQL. So in about half of the cases
  for the worker endpoints, each `lease_token` is replaced with a real one
  (a job enqueued on a queue of the hooks' own and claimed for the purpose),
  or with one already used (the idempotent-repeat and `lease_lost` paths); and
  in about half of the cases for `/v1/jobs/{id}...`, the id is a real job's.
  Everything else in the request stays as generated, so the generated results,
  errors, checkpoints and retry delays go through the guarded writes and come
  back out of PostgreSQL.
- Capped long-polls. A `wait_ms` inside its valid range (1 to 60000) is lowered
  to at most WAIT_CAP_MS, so a claim on an empty queue or a read of a running
  job does not hold a test for up to a minute. The answer after a short wait
  is the same as after a long one; out-of-range values are left alone, so the
  400 and 422 answers to them are still checked.

RUNLEASE_SCHEMATHESIS_URL is the coordinator's base URL.
"""

from __future__ import annotations

import json
import os
import random
import urllib.request

import schemathesis

WAIT_CAP_MS = 50
WAIT_MAX_MS = 60_000
BASE_URL = os.environ.get("RUNLEASE_SCHEMATHESIS_URL", "")
HOOK_QUEUE = "schemathesis-hooks"
WORKER_ENDPOINTS = {"/v1/heartbeat", "/v1/complete", "/v1/fail", "/v1/release", "/v1/finish"}

_rng = random.Random(int(os.environ.get("SCHEMATHESIS_SEED", "0")))
_used_tokens: list[str] = []
_job_ids: list[str] = []


def _post(path: str, body: object) -> dict:
    request = urllib.request.Request(
        BASE_URL + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _fresh_lease() -> str | None:
    """Enqueues a job on the hooks' queue and claims one: a live lease token."""
    job = _post("/v1/jobs", {"queue": HOOK_QUEUE, "payload": {"from": "schemathesis hooks"}})
    _job_ids.append(job["id"])
    leases = _post("/v1/claim", {"queues": [HOOK_QUEUE], "worker_id": "schemathesis-hooks", "max_jobs": 1})["leases"]
    if not leases:
        return None
    _job_ids.append(leases[0]["job_id"])
    _used_tokens.append(leases[0]["lease_token"])
    return leases[0]["lease_token"]


def _real_token(generated: str) -> str:
    if _used_tokens and _rng.random() < 0.3:
        return _rng.choice(_used_tokens)
    return _fresh_lease() or generated


def _cap(container: object) -> None:
    if not isinstance(container, dict):
        return
    value = container.get("wait_ms")
    if isinstance(value, bool):
        return
    if isinstance(value, int) and 0 < value <= WAIT_MAX_MS:
        container["wait_ms"] = min(value, WAIT_CAP_MS)
    elif isinstance(value, str) and value.isascii() and value.isdigit() and 0 < int(value) <= WAIT_MAX_MS:
        container["wait_ms"] = str(min(int(value), WAIT_CAP_MS))


def _swap_tokens(body: object) -> None:
    if not isinstance(body, dict):
        return
    if isinstance(body.get("lease_token"), str):
        body["lease_token"] = _real_token(body["lease_token"])
    for key in ("leases", "items"):
        items = body.get(key)
        if isinstance(items, list):
            for item in items:
                if isinstance(item, dict) and isinstance(item.get("lease_token"), str):
                    item["lease_token"] = _real_token(item["lease_token"])


@schemathesis.hook
def map_case(context, case):
    _cap(case.body)
    _cap(case.query)
    if not BASE_URL:
        return case
    path = case.operation.path
    if path in WORKER_ENDPOINTS and _rng.random() < 0.5:
        _swap_tokens(case.body)
    elif path.startswith("/v1/jobs/{id}") and isinstance(case.path_parameters, dict) and _rng.random() < 0.5:
        if not _job_ids:
            _fresh_lease()
        case.path_parameters["id"] = _rng.choice(_job_ids)
    return case
