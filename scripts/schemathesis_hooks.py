"""Schemathesis hooks for scripts/schemathesis.sh.

Four changes to the generated requests, all so the run reaches more of the
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
- Capped long-polls. A `wait_ms` inside its valid range (1 to 60000), of a
  claim or of the claim riding on a finish, is lowered
  to at most WAIT_CAP_MS, so a claim on an empty queue or a read of a running
  job does not hold a test for up to a minute. The answer after a short wait
  is the same as after a long one; out-of-range values are left alone, so the
  400 and 422 answers to them are still checked.
- Queues with jobs. A queue name schemathesis makes up holds no job, so a
  listing, a bulk action or a queue read of it touches no row. So in about
  half of the cases for `GET /v1/jobs`, `POST /v1/jobs/bulk` and
  `/v1/queues/{queue}`, the queue is one of the hooks' own, which hold jobs
  in every state (enqueued, claimed, completed, failed, re-queued, cancelled,
  delayed, and claimed and left to expire); a listing's `cursor` is then, half
  of the time, a real `next_cursor` of the same listing, and a bulk action's
  `ids` real job ids. Settings are changed on a queue of their own, so a
  generated pause or limit never stops the hooks' claims (which resume a
  paused queue of theirs, and clear its flow-control limits, when a claim
  comes back empty). Done jobs of the ops queue are kept for a second, so
  the prune loop deletes jobs during the run too.
- Schedules that parse and exist. A cron expression or time zone
  schemathesis makes up almost never parses, so in about half of the
  `PUT /v1/schedules/{name}` cases the body gets a valid cron expression
  (5 or 6 fields, some on daylight-saving gaps and repeats) and a valid IANA
  time zone; every generated schedule with a valid queue name goes to a
  queue of the hooks' own. The valid expressions fire on one day a year at
  most, and after each call any schedule that would fire within a day is deleted,
  so a generated per-second schedule never keeps enqueuing jobs through the
  run. In about half of the cases for `/v1/schedules/{name}`, the name is
  that of a schedule that exists (the PUT replaces it, the DELETE deletes
  it).

RUNLEASE_SCHEMATHESIS_URL is the coordinator's base URL.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import re
import urllib.error
import urllib.parse
import urllib.request

import schemathesis

WAIT_CAP_MS = 50
WAIT_MAX_MS = 60_000
BASE_URL = os.environ.get("RUNLEASE_SCHEMATHESIS_URL", "")
HOOK_QUEUE = "schemathesis-hooks"
# Jobs in every state, for listings, bulk actions and queue reads.
OPS_QUEUE = "schemathesis-ops"
# A queue with jobs whose settings the generated PATCH requests change.
SETTINGS_QUEUE = "schemathesis-settings"
# The queue every generated schedule enqueues on.
SCHEDULE_QUEUE = "schemathesis-schedules"
# Valid cron expressions that fire on one day a year at most (the 28 March
# and 31 October ones are on daylight-saving changes in Europe in 2027: a
# skipped and a repeated local time), and valid time zones.
VALID_CRONS = [
    "0 0 1 1 *",
    "0 0 0 1 1 *",
    "30 2 28 3 *",
    "15 1 31 10 *",
    "*/20 30 2 28 MAR *",
    "0 12 25 DEC *",
    "0 0 29 2 *",
    "59 23 L 12 *",
]
VALID_TIMEZONES = ["UTC", "Europe/Paris", "Europe/London", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]
QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:/@-]{1,128}$")
# A schedule whose next fire time is closer than this is deleted after its PUT.
FIRE_HORIZON = datetime.timedelta(days=1)
FLOW_LIMITS = ("max_running", "max_running_per_key", "rate_limit")
WORKER_ENDPOINTS = {"/v1/heartbeat", "/v1/complete", "/v1/fail", "/v1/release", "/v1/finish"}
JOB_STATES = {"queued", "enqueue_failed", "running", "done", "failed", "cancelled"}
# Jobs one seeding of the ops queue enqueues (and one more, delayed).
SEED_JOBS = 6

_rng = random.Random(int(os.environ.get("SCHEMATHESIS_SEED", "0")))
_used_tokens: list[str] = []
_job_ids: list[str] = []
_ops_ids: list[str] = []
_settings_seeded = False
# Schedules that exist (and fire a year away at most).
_schedule_names: list[str] = []


def _call(method: str, path: str, body: object = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        BASE_URL + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _post(path: str, body: object) -> dict:
    return _call("POST", path, body)


def _claim(queue: str, max_jobs: int) -> list[dict]:
    """Claims from one of the hooks' queues. When that hands out nothing, a
    pause or a flow-control limit a generated PATCH set on the queue is
    undone (resumed, limits cleared) and the claim is made again."""
    request = {"queues": [queue], "worker_id": "schemathesis-hooks", "max_jobs": max_jobs}
    leases = _post("/v1/claim", request)["leases"]
    if leases:
        return leases
    path = "/v1/queues/" + urllib.parse.quote(queue, safe="")
    settings = _call("GET", path)["settings"]
    change: dict = {limit: None for limit in FLOW_LIMITS if settings.get(limit) is not None}
    if settings["paused"]:
        change["paused"] = False
    if change:
        _call("PATCH", path, change)
        leases = _post("/v1/claim", request)["leases"]
    return leases


def _fresh_lease() -> str | None:
    """Enqueues a job on the hooks' queue and claims one: a live lease token."""
    job = _post("/v1/jobs", {"queue": HOOK_QUEUE, "payload": {"from": "schemathesis hooks"}})
    _job_ids.append(job["id"])
    leases = _claim(HOOK_QUEUE, 1)
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


def _seed_ops() -> None:
    """Jobs on the ops queue in every state: some stay queued, one is delayed
    and then cancelled, and of the claimed ones one completes, one fails for
    good, one fails and is queued again, and one is left running until its
    lease expires (the reaper re-queues it). Done jobs of the ops queue are
    kept one second only, so the prune loop deletes some while the run
    lists and changes them."""
    if not _ops_ids:
        _call("PATCH", "/v1/queues/" + OPS_QUEUE, {"retention_done_ms": 1000})
    jobs = [{"queue": OPS_QUEUE, "payload": {"seed": i}} for i in range(SEED_JOBS)]
    jobs.append({"queue": OPS_QUEUE, "payload": {"seed": "delayed"}, "delay_ms": 3_600_000})
    created = _post("/v1/jobs/batch", {"jobs": jobs})["jobs"]
    _ops_ids.extend(job["id"] for job in created)
    try:
        _post(f"/v1/jobs/{created[-1]['id']}/cancel", None)
    except urllib.error.HTTPError:
        pass  # already cancelled by a generated bulk action
    leases = _claim(OPS_QUEUE, 4)
    outcomes = [
        {"action": "complete", "result": {"seeded": True}},
        {"action": "fail", "error": "seeded failure", "retryable": False},
        {"action": "fail", "error": "seeded retry", "retry_after_ms": 0},
    ]
    items = [dict(outcome, lease_token=lease["lease_token"]) for lease, outcome in zip(leases, outcomes)]
    if items:
        _post("/v1/finish", {"items": items})


def _ops_queue() -> str:
    if not _ops_ids or _rng.random() < 0.2:
        _seed_ops()
    return OPS_QUEUE


def _settings_queue() -> str:
    global _settings_seeded
    if not _settings_seeded:
        _post("/v1/jobs/batch", {"jobs": [{"queue": SETTINGS_QUEUE, "payload": i} for i in range(3)]})
        _settings_seeded = True
    return SETTINGS_QUEUE


def _states_of(value: object) -> str | None:
    """The `state` query value as the server reads it, if it names only job states."""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(v) for v in value)
    if isinstance(value, str) and value and all(s in JOB_STATES for s in value.split(",")):
        return value
    return None


def _real_cursor(states: str | None) -> str | None:
    """The `next_cursor` of the ops queue's first one-job page with these states."""
    query = {"queue": OPS_QUEUE, "limit": "1"}
    if states:
        query["state"] = states
    return _call("GET", "/v1/jobs?" + urllib.parse.urlencode(query))["next_cursor"]


def _map_listing(case) -> None:
    query = case.query
    if not isinstance(query, dict) or not isinstance(query.get("queue"), str) or _rng.random() >= 0.5:
        return
    query["queue"] = _ops_queue()
    states = query.get("state")
    if "cursor" in query and _rng.random() < 0.5 and (states is None or _states_of(states)):
        cursor = _real_cursor(_states_of(states))
        if cursor:
            query["cursor"] = cursor


def _map_bulk(case) -> None:
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("queue"), str) or _rng.random() >= 0.5:
        return
    body["queue"] = _ops_queue()
    ids = body.get("ids")
    if isinstance(ids, list) and ids and _ops_ids:
        body["ids"] = [_rng.choice(_ops_ids) if _rng.random() < 0.5 else i for i in ids]


def _map_queue(case) -> None:
    params = case.path_parameters
    if not isinstance(params, dict) or not isinstance(params.get("queue"), str) or _rng.random() >= 0.5:
        return
    if case.operation.method.upper() == "PATCH":
        params["queue"] = _settings_queue()
    else:
        params["queue"] = _rng.choice([_ops_queue(), HOOK_QUEUE, _settings_queue()])


def _schedule_path(name: str) -> str:
    # `.` and `..` percent-encoded too, or they are dot segments.
    segment = urllib.parse.quote(name, safe="")
    return "/v1/schedules/" + (segment.replace(".", "%2E") if segment in (".", "..") else segment)


def _existing_schedule() -> str:
    """The name of a schedule that exists, creating one if none does."""
    if not _schedule_names:
        name = f"schemathesis-hooks-{_rng.randrange(1_000_000)}"
        body = {
            "queue": SCHEDULE_QUEUE,
            "cron": _rng.choice(VALID_CRONS),
            "timezone": _rng.choice(VALID_TIMEZONES),
            "payload": {"from": "schemathesis hooks"},
        }
        _call("PUT", _schedule_path(name), body)
        _schedule_names.append(name)
    return _rng.choice(_schedule_names)


def _map_schedule(case) -> None:
    method = case.operation.method.upper()
    params = case.path_parameters
    if isinstance(params, dict) and isinstance(params.get("name"), str) and _rng.random() < 0.5:
        params["name"] = _existing_schedule()
    body = case.body
    if method != "PUT" or not isinstance(body, dict):
        return
    if isinstance(body.get("queue"), str) and QUEUE_NAME.match(body["queue"]):
        body["queue"] = SCHEDULE_QUEUE
    if _rng.random() < 0.5:
        body["cron"] = _rng.choice(VALID_CRONS)
        if "timezone" in body or _rng.random() < 0.5:
            body["timezone"] = _rng.choice(VALID_TIMEZONES)


def _fires_soon(schedule: dict) -> bool:
    next_fire = schedule.get("next_fire_at")
    if not isinstance(next_fire, str):
        return False  # paused
    at = datetime.datetime.fromisoformat(next_fire.replace("Z", "+00:00"))
    return at - datetime.datetime.now(datetime.timezone.utc) < FIRE_HORIZON


@schemathesis.hook
def after_call(context, case, response):
    """Keeps track of the schedules that exist, and deletes any that a
    generated PUT made to fire within a day."""
    if not BASE_URL or case.operation.path != "/v1/schedules/{name}":
        return
    method = case.operation.method.upper()
    if response.status_code not in (200, 201):
        return
    try:
        schedule = response.json()
    except Exception:  # noqa: BLE001 - not JSON: nothing to track
        return
    name = schedule.get("name") if isinstance(schedule, dict) else None
    if not isinstance(name, str):
        return
    if method == "DELETE":
        while name in _schedule_names:
            _schedule_names.remove(name)
    elif method == "PUT":
        if _fires_soon(schedule):
            while name in _schedule_names:
                _schedule_names.remove(name)
            try:
                _call("DELETE", _schedule_path(name))
            except urllib.error.HTTPError:
                pass  # deleted meanwhile
        elif name not in _schedule_names:
            _schedule_names.append(name)


@schemathesis.hook
def map_case(context, case):
    _cap(case.body)
    _cap(case.query)
    if isinstance(case.body, dict):
        # A finish's claim long-polls too.
        _cap(case.body.get("claim"))
    if not BASE_URL:
        return case
    path = case.operation.path
    if path in WORKER_ENDPOINTS and _rng.random() < 0.5:
        _swap_tokens(case.body)
    elif path.startswith("/v1/jobs/{id}") and isinstance(case.path_parameters, dict) and _rng.random() < 0.5:
        if not _job_ids:
            _fresh_lease()
        case.path_parameters["id"] = _rng.choice(_job_ids)
    elif path == "/v1/jobs" and case.operation.method.upper() == "GET":
        _map_listing(case)
    elif path == "/v1/jobs/bulk":
        _map_bulk(case)
    elif path == "/v1/queues/{queue}":
        _map_queue(case)
    elif path.startswith("/v1/schedules/{name}"):
        _map_schedule(case)
    return case
