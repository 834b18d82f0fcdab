"""The Python runner of `sdk/conformance/`: each scenario through this library, blocking or asyncio.

The format is described in `sdk/conformance/README.md`. The runner drives the
library's own `Worker`/`AsyncWorker`, `PushHandler` and `Producer`, with an
httpx transport that records every request and injects the faults a
scenario asks for.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import httpx
from standardwebhooks.webhooks import Webhook

import runlease
from runlease import Attempt, AsyncWorker, JobFailed, Producer, PushHandler, ReleaseJob, RetryLater, Worker

SCENARIOS = Path(__file__).resolve().parents[2] / "conformance" / "scenarios"


class StepFailed(AssertionError):
    pass


# ---- matching ----

def _type_of(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def match(pattern: Any, actual: Any, where: str = "") -> None:
    """Raises StepFailed naming the first place `actual` differs from `pattern`."""
    if isinstance(pattern, dict) and len(pattern) == 1 and next(iter(pattern)).startswith("$"):
        (op, arg), = pattern.items()
        ok = {
            "$contains": lambda: isinstance(actual, str) and arg in actual,
            "$type": lambda: _type_of(actual) == arg,
            "$gte": lambda: _type_of(actual) == "number" and actual >= arg,
            "$lte": lambda: _type_of(actual) == "number" and actual <= arg,
            "$present": lambda: True,  # handled by the object case
            "$none_after_abort": lambda: isinstance(actual, list) and len(actual) > 0
            and not any(r.get("after_abort") for r in actual),
        }[op]()
        if not ok:
            raise StepFailed(f"{where or '.'}: {json.dumps(actual)[:300]} does not match {op} {arg}")
        return
    if isinstance(pattern, dict):
        if not isinstance(actual, dict):
            raise StepFailed(f"{where or '.'}: want an object, got {json.dumps(actual)[:300]}")
        for k, p in pattern.items():
            if isinstance(p, dict) and list(p) == ["$present"]:
                if (k in actual) != bool(p["$present"]):
                    raise StepFailed(f"{where}.{k}: present is {k in actual}, want {p['$present']}")
                continue
            if k not in actual:
                raise StepFailed(f"{where}.{k}: missing in {json.dumps(actual)[:300]}")
            match(p, actual[k], f"{where}.{k}")
        return
    if isinstance(pattern, list):
        if not isinstance(actual, list) or len(actual) != len(pattern):
            raise StepFailed(f"{where or '.'}: want {len(pattern)} elements, got {json.dumps(actual)[:400]}")
        for i, (p, a) in enumerate(zip(pattern, actual)):
            match(p, a, f"{where}[{i}]")
        return
    if pattern != actual or isinstance(pattern, bool) != isinstance(actual, bool):
        raise StepFailed(f"{where or '.'}: {json.dumps(actual)[:300]} != {json.dumps(pattern)}")


# ---- the recording transport ----

def _tokens(body: Any) -> Set[str]:
    found: Set[str] = set()
    if isinstance(body, dict):
        if isinstance(body.get("lease_token"), str):
            found.add(body["lease_token"])
        for key in ("items", "leases"):
            for item in body.get(key) or []:
                if isinstance(item, dict) and isinstance(item.get("lease_token"), str):
                    found.add(item["lease_token"])
    return found


class Recorder:
    """What a worker sent, and the faults it is under."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: List[Dict[str, Any]] = []
        self.drop: Dict[str, int] = {}
        self.unreachable: Set[str] = set()
        self.aborted_tokens: Set[str] = set()

    def before(self, request: httpx.Request) -> Tuple[Dict[str, Any], str]:
        """Records the request; answers its record and the fault to apply (`"" | "drop" | "unreachable"`)."""
        path = request.url.path
        body = json.loads(request.content) if request.content else None
        with self.lock:
            record = {"path": path, "body": body, "status": None, "answer": None,
                      "after_abort": bool(_tokens(body) & self.aborted_tokens), "tokens": _tokens(body)}
            self.records.append(record)
            if "*" in self.unreachable or path in self.unreachable:
                return record, "unreachable"
            if self.drop.get(path, 0) > 0:
                self.drop[path] -= 1
                return record, "drop"
        return record, ""

    def after(self, record: Dict[str, Any], status: int, content: bytes) -> None:
        record["status"] = status
        try:
            record["answer"] = json.loads(content) if content else None
        except ValueError:
            record["answer"] = None
        if isinstance(record["answer"], dict):
            record["tokens"] |= _tokens(record["answer"])


class SyncRecording(httpx.BaseTransport):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        record, fault = self.recorder.before(request)
        if fault == "unreachable":
            raise httpx.ConnectError("unreachable (injected)", request=request)
        response = self.inner.handle_request(request)
        content = response.read()
        response.close()
        if fault == "drop":
            raise httpx.ReadError("answer dropped (injected)", request=request)
        self.recorder.after(record, response.status_code, content)
        return httpx.Response(response.status_code, headers=response.headers, content=content, request=request)


class AsyncRecording(httpx.AsyncBaseTransport):
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        record, fault = self.recorder.before(request)
        if fault == "unreachable":
            raise httpx.ConnectError("unreachable (injected)", request=request)
        response = await self.inner.handle_async_request(request)
        content = await response.aread()
        await response.aclose()
        if fault == "drop":
            raise httpx.ReadError("answer dropped (injected)", request=request)
        self.recorder.after(record, response.status_code, content)
        return httpx.Response(response.status_code, headers=response.headers, content=content, request=request)


# ---- handler runs ----

class Runs:
    """Every handler run of a scenario, by job id."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.by_job: Dict[str, List[Dict[str, Any]]] = {}
        self.tokens: Dict[str, Set[str]] = {}
        self.recorders: List[Recorder] = []

    def started(self, attempt: Attempt) -> Dict[str, Any]:
        run = {"attempt": attempt.attempt, "run_lease": attempt.run_lease, "progress": attempt.progress,
               "aborted": None}
        with self.cond:
            self.by_job.setdefault(attempt.job_id, []).append(run)
            self.tokens.setdefault(attempt.job_id, set()).add(attempt.lease_token)
            self.cond.notify_all()

        def aborted(reason: str) -> None:
            with self.cond:
                run["aborted"] = reason
                for recorder in self.recorders:
                    with recorder.lock:
                        recorder.aborted_tokens.add(attempt.lease_token)
                self.cond.notify_all()

        attempt.on_stop(aborted)
        return run

    def wait(self, job_id: str, done: Callable[[List[Dict[str, Any]]], bool], timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        with self.cond:
            while not done(self.by_job.get(job_id, [])):
                left = end - time.monotonic()
                if left <= 0:
                    raise StepFailed(f"{what}: runs are {self.by_job.get(job_id, [])}")
                self.cond.wait(left)


def blocking_behaviour(spec: Dict[str, Any], runs: Runs) -> Callable[[Attempt], Any]:
    name = spec["behaviour"]

    def handler(attempt: Attempt) -> Any:
        run = runs.started(attempt)
        if name == "complete":
            return spec.get("result")
        if name == "heartbeat_then_complete":
            if spec.get("progress") is not None:
                attempt.checkpoint(spec["progress"])
            want = attempt.renewals + int(spec.get("heartbeats", 1))
            while attempt.renewals < want:
                attempt.sleep(0.02)
            return spec.get("result")
        if name == "fail":
            raise JobFailed(spec["error"], retryable=spec.get("retryable", True),
                            retry_after_ms=spec.get("retry_after_ms"))
        if name == "release_then_resume":
            if attempt.progress is None:
                raise ReleaseJob(spec["progress"])
            return {"resumed_from": attempt.progress}
        if name == "hold_until_aborted":
            attempt.signal.wait()
            attempt.check()
        if name == "not_now":
            raise RetryLater(int(spec["retry_after_ms"]))
        raise StepFailed(f"unknown behaviour {name} (run {run})")

    return handler


def async_behaviour(spec: Dict[str, Any], runs: Runs) -> Callable[[Attempt], Any]:
    name = spec["behaviour"]
    blocking = blocking_behaviour(spec, runs)

    async def handler(attempt: Attempt) -> Any:
        if name == "heartbeat_then_complete":
            runs.started(attempt)
            if spec.get("progress") is not None:
                attempt.checkpoint(spec["progress"])
            want = attempt.renewals + int(spec.get("heartbeats", 1))
            while attempt.renewals < want:
                await asyncio.sleep(0.02)
            return spec.get("result")
        if name == "hold_until_aborted":
            runs.started(attempt)
            await asyncio.Event().wait()  # until the worker cancels this task
        return blocking(attempt)

    return handler


# ---- the runner ----

class Loop:
    """An asyncio event loop on a thread of its own, for the asyncio mode."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any, timeout: Optional[float] = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


class Scenario:
    def __init__(self, doc: Dict[str, Any], url: str, key: Optional[str], mode: str) -> None:
        self.doc = doc
        self.url = url
        self.key = key
        self.mode = mode
        self.queue = f"conf-{doc['name']}-{uuid.uuid4().hex[:8]}"[:128]
        self.producer = Producer(url, key)
        self.jobs: Dict[str, str] = {}
        self.workers: Dict[str, Dict[str, Any]] = {}
        self.leases: Dict[str, Dict[str, Any]] = {}
        self.pushes: Dict[str, PushHandler] = {}
        self.runs = Runs()
        self.loop = Loop() if mode == "asyncio" else None

    def ref(self, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self.ref(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.ref(v) for v in value]
        if isinstance(value, str) and value.startswith("$"):
            parts = value[1:].split(".")
            if parts == ["queue"]:
                return self.queue
            if parts == ["url"]:
                return self.url
            if parts[0] == "job" and len(parts) == 3:
                return self.jobs[parts[1]]
            if parts[0] == "worker" and len(parts) == 3:
                return self.workers[parts[1]]["worker_id"]
            if parts[0] == "lease" and len(parts) == 3:
                return self.leases[parts[1]][parts[2]]
        return value

    def run(self) -> None:
        try:
            for i, step in enumerate(self.doc["steps"]):
                try:
                    getattr(self, "do_" + step["do"])(self.ref(step))
                except StepFailed as e:
                    raise StepFailed(f"step {i} ({step['do']}): {e}") from None
        finally:
            for name in list(self.workers):
                self._stop(name)
            if self.loop is not None:
                self.loop.close()
            self.producer.close()

    # ---- steps ----

    def do_enqueue(self, step: Dict[str, Any]) -> None:
        job = dict(step["job"])
        queue = job.pop("queue", self.queue)
        payload = job.pop("payload", None)
        self.jobs[step["as"]] = self.producer.enqueue(queue, payload, **job).id

    def do_start_worker(self, step: Dict[str, Any]) -> None:
        name = step["as"]
        worker_id = f"conf-{name}-{uuid.uuid4().hex[:8]}"
        recorder = Recorder()
        self.runs.recorders.append(recorder)
        options = dict(key=self.key, worker_id=worker_id, concurrency=step.get("concurrency", 1),
                       wait_ms=step.get("wait_ms", 1000), grace=2.0)
        entry: Dict[str, Any] = {"worker_id": worker_id, "recorder": recorder}
        if self.loop is None:
            worker = Worker(self.url, [self.queue], blocking_behaviour(step["handler"], self.runs),
                            http=httpx.Client(transport=SyncRecording(recorder)), **options)
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            entry.update(worker=worker, thread=thread)
        else:
            loop = self.loop

            async def make() -> AsyncWorker:
                return AsyncWorker(self.url, [self.queue], async_behaviour(step["handler"], self.runs),
                                   http=httpx.AsyncClient(transport=AsyncRecording(recorder)), **options)

            aworker = loop.run(make())
            entry.update(worker=aworker, future=asyncio.run_coroutine_threadsafe(aworker.run(), loop.loop))
        self.workers[name] = entry

    def _stop(self, name: str) -> None:
        entry = self.workers[name]
        if entry.get("stopped"):
            return
        entry["stopped"] = True
        if self.loop is None:
            entry["worker"].stop()
            entry["thread"].join(30)
            if entry["thread"].is_alive():
                raise StepFailed("the worker did not drain within 30 s")
        else:
            self.loop.loop.call_soon_threadsafe(entry["worker"].stop)
            entry["future"].result(30)

    def do_stop_worker(self, step: Dict[str, Any]) -> None:
        self._stop(step["worker"])

    def do_wait_job(self, step: Dict[str, Any]) -> None:
        end = time.monotonic() + step.get("timeout_ms", 15000) / 1000
        while True:
            left = int((end - time.monotonic()) * 1000)
            job = self.producer.get(self.jobs[step["job"]], wait_ms=max(0, min(left, 1000)))
            if job.state == step["state"]:
                return
            if left <= 0:
                raise StepFailed(f"state is {job.state}, want {step['state']}")
            if job.is_terminal:
                time.sleep(0.05)  # a terminal job answers at once: do not spin

    def do_expect_job(self, step: Dict[str, Any]) -> None:
        match(step["expect"], self.producer.get(self.jobs[step["job"]]).raw)

    def do_cancel(self, step: Dict[str, Any]) -> None:
        self.producer.cancel(self.jobs[step["job"]])

    def do_wait_handler(self, step: Dict[str, Any]) -> None:
        event = step["event"]
        if event == "started":
            def done(runs: List[Dict[str, Any]]) -> bool:
                return bool(runs)
        else:
            def done(runs: List[Dict[str, Any]]) -> bool:
                return any(r["aborted"] for r in runs)
        self.runs.wait(self.jobs[step["job"]], done, step.get("timeout_ms", 15000) / 1000, f"wait_handler {event}")

    def do_expect_handler(self, step: Dict[str, Any]) -> None:
        with self.runs.cond:
            runs = [dict(r) for r in self.runs.by_job.get(self.jobs[step["job"]], [])]
        match(step["runs"], runs)

    def do_fault(self, step: Dict[str, Any]) -> None:
        recorder: Recorder = self.workers[step["worker"]]["recorder"]
        with recorder.lock:
            if "drop_answer" in step:
                recorder.drop[step["drop_answer"]["path"]] = int(step["drop_answer"].get("times", 1))
            if "unreachable" in step:
                recorder.unreachable.update(step["unreachable"]["paths"])

    def do_heal(self, step: Dict[str, Any]) -> None:
        recorder: Recorder = self.workers[step["worker"]]["recorder"]
        with recorder.lock:
            recorder.drop.clear()
            recorder.unreachable.clear()

    def do_expect_requests(self, step: Dict[str, Any]) -> None:
        recorder: Recorder = self.workers[step["worker"]]["recorder"]
        job_id = self.jobs[step["job"]]
        with recorder.lock:
            tokens = set(self.runs.tokens.get(job_id, set()))
            for r in recorder.records:
                for lease in (r["answer"] or {}).get("leases", []) if isinstance(r["answer"], dict) else []:
                    if isinstance(lease, dict) and lease.get("job_id") == job_id and "lease_token" in lease:
                        tokens.add(lease["lease_token"])
            chosen = [{k: v for k, v in r.items() if k != "tokens"} for r in recorder.records
                      if (step["path"] == "*" or r["path"] == step["path"]) and r["tokens"] & tokens
                      and r["body"] is not None and _tokens(r["body"]) & tokens]
        match(step["expect"], chosen)

    def do_claim(self, step: Dict[str, Any]) -> None:
        headers = {"authorization": f"Bearer {self.key}"} if self.key else {}
        body = {"queues": [self.queue], "worker_id": f"conf-runner-{uuid.uuid4().hex[:8]}", "max_jobs": 1,
                "wait_ms": 5000}
        answer = httpx.post(self.url.rstrip("/") + "/v1/claim", json=body, headers=headers, timeout=35).json()
        leases = answer["leases"]
        if len(leases) != 1 or leases[0]["job_id"] != self.jobs[step["job"]]:
            raise StepFailed(f"the claim answered {answer}")
        self.leases[step["as"]] = leases[0]

    def do_push(self, step: Dict[str, Any]) -> None:
        lease = self.leases[step["lease"]]
        job = self.producer.get(lease["job_id"])
        doc = {"job": {"id": job.id, "queue": job.queue, "payload": job.payload, "attempt": job.attempt,
                       "max_attempts": job.max_attempts, "progress": job.progress},
               "lease": {k: lease[k] for k in ("lease_token", "run_lease", "lease_ttl_ms", "heartbeat_interval_ms")},
               "coordinator_url": self.url}
        body = json.dumps(doc)
        msg_id = f"{job.id}:{lease['run_lease']}"
        at = datetime.datetime.now(tz=datetime.timezone.utc) + datetime.timedelta(
            seconds=step.get("timestamp_offset_s", 0))
        kind = step.get("signature", "valid")
        signer = Webhook(step["secret"] if kind != "forged" else
                         "whsec_" + base64.b64encode(os.urandom(32)).decode())
        headers = {"content-type": "application/json", "webhook-id": msg_id,
                   "webhook-timestamp": str(int(at.timestamp())),
                   "webhook-signature": signer.sign(msg_id, at, body)}
        raw = body.encode()
        if kind == "tampered":
            raw = raw.replace(b"a@example.com", b"b@example.com") if b"a@example.com" in raw else raw + b" "
        if kind == "none":
            del headers["webhook-signature"]
        handoff = step.get("handoff_after_ms")
        options = dict(key=self.key, handoff_after=None if handoff is None else handoff / 1000)
        if self.loop is None:
            push = PushHandler(step["secret"], blocking_behaviour(step["handler"], self.runs), **options)
            response = push.handle(raw, headers)
        else:
            loop = self.loop

            async def handle() -> runlease.PushResponse:
                apush = PushHandler(step["secret"], async_behaviour(step["handler"], self.runs), **options)
                self.pushes[step["as"]] = apush
                return await apush.handle_async(raw, headers)

            response = loop.run(handle(), 30)
            push = self.pushes[step["as"]]
        self.pushes[step["as"]] = push
        text = response.body.decode()
        try:
            parsed: Any = json.loads(text) if text else None
        except ValueError:
            parsed = text
        match(step["expect"], {"status": response.status, "headers": response.headers, "body": parsed})

    def do_wait_push(self, step: Dict[str, Any]) -> None:
        push = self.pushes[step["push"]]
        timeout = step.get("timeout_ms", 15000) / 1000
        if self.loop is None:
            push.wait_background_blocking(timeout)
            if any(not f.done() for f in push.background):
                raise StepFailed("the handed-off work did not end in time")
        else:
            self.loop.run(asyncio.wait_for(push.wait_background(), timeout))


def scenario_names() -> List[str]:
    return sorted(p.stem for p in SCENARIOS.glob("*.json"))


def run_scenario(name: str, url: str, key: Optional[str], mode: str) -> None:
    doc = json.loads((SCENARIOS / f"{name}.json").read_text())
    Scenario(doc, url, key, mode).run()
