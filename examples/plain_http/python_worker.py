#!/usr/bin/env python3
"""A runlease worker in plain Python (standard library only).

The reference for a worker in a language without a runlease library: it
keeps docs/workers.md's checklist by hand, with nothing but the standard
library (which is also why the container demo, infra/docker-compose.yml,
runs it in a stock Python image). In Python itself, use the library
(sdk/python; examples/python_worker.py), which does all of this for you.

It speaks the v1 protocol over HTTP (docs/protocol.md, docs/openapi.yaml):

- claims with a long-poll (`POST /v1/claim`, `wait_ms`) up to its free slots;
- runs each job's handler in a thread of its own;
- heartbeats every held lease in one request per interval from a background
  thread (`POST /v1/heartbeat`), saving the handler's checkpoint as `progress`;
- stops a handler when its lease is lost (`lease_lost`: the job is dropped,
  nothing is sent), when a cancel is requested (`cancel_requested`:
  acknowledged with `fail`), when the job's `timeout_ms` has passed, or when no
  heartbeat has succeeded for a whole lease TTL (it cannot know whether it
  still holds the lease, so it stops, as the coordinator will reap it);
- completes or fails with the lease token in one `POST /v1/finish`, which
  also claims the next job for the slot it frees (the coordinator claims once
  the outcome is committed): a busy worker spends one request per job;
  finishing is idempotent per lease, so a lost answer is retried;
- drains on SIGTERM or SIGINT: stops claiming, lets running handlers finish
  for `--grace-ms`, stops the rest and releases them with their checkpoint
  (a `release` item), then exits 0.

Handlers must be replay-safe: delivery is at-least-once. `job.job_id` and
`job.run_lease` together are a fencing token to stamp on side effects.

The handler below is a demonstration: it echoes the payload, and understands
`{"sleep_ms": N}` (works N ms, checkpointing its progress) and `{"fail":
"message", "retryable": false}` (fails). Replace `handle` with your own.

    python3 examples/plain_http/python_worker.py --url http://127.0.0.1:8080 --queue emails
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any


class JobFailed(Exception):
    """Raise from a handler to fail the attempt with this message."""

    def __init__(self, message: str, retryable: bool = True, retry_after_ms: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms


class Stopped(Exception):
    """Raised by `Job.check` once the handler must stop."""


class Job:
    """One claimed job, as the handler sees it."""

    def __init__(self, lease: dict[str, Any]):
        self.job_id: str = lease["job_id"]
        self.run_lease: int = lease["run_lease"]
        self.lease_token: str = lease["lease_token"]
        self.queue: str = lease["queue"]
        self.payload: Any = lease["payload"]
        self.attempt: int = lease["attempt"]
        self.progress: Any = lease.get("progress")
        self.lease_ttl_s: float = lease["lease_ttl_ms"] / 1000
        self.heartbeat_interval_s: float = lease["heartbeat_interval_ms"] / 1000
        self.deadline: float = time.monotonic() + lease["timeout_ms"] / 1000
        # The claim was the first renewal; self-fencing counts from the last one.
        self.renewed_at: float = time.monotonic()
        self._stop = threading.Event()
        self.stop_reason: str | None = None
        self._lock = threading.Lock()
        self._checkpoint: Any = None

    def stop(self, reason: str) -> None:
        """Asks the handler to stop (first reason wins)."""
        with self._lock:
            if self.stop_reason is None:
                self.stop_reason = reason
        self._stop.set()

    def stopping(self) -> bool:
        """Whether the handler should stop now."""
        if not self._stop.is_set() and time.monotonic() >= self.deadline:
            self.stop("timeout")
        return self._stop.is_set()

    def check(self) -> None:
        """Raises `Stopped` once the handler should stop."""
        if self.stopping():
            raise Stopped(self.stop_reason or "stopped")

    def sleep(self, seconds: float) -> None:
        """Sleeps, waking early (with `Stopped`) when the handler must stop."""
        end = time.monotonic() + seconds
        while True:
            self.check()
            left = end - time.monotonic()
            if left <= 0:
                return
            self._stop.wait(min(left, 0.05))

    def checkpoint(self, progress: Any) -> None:
        """Saves `progress`; it goes out with the next heartbeat (and a release)."""
        with self._lock:
            self._checkpoint = progress
            self.progress = progress

    def pending_checkpoint(self) -> Any:
        """The checkpoint not yet sent, or None."""
        with self._lock:
            return self._checkpoint

    def checkpoint_sent(self, progress: Any) -> None:
        """Forgets `progress` once a heartbeat carried it (unless a newer one came)."""
        with self._lock:
            if self._checkpoint is progress:
                self._checkpoint = None


def handle(job: Job) -> Any:
    """The demonstration handler: returns the job's result or raises `JobFailed`."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if "fail" in payload:
        raise JobFailed(str(payload["fail"]), retryable=bool(payload.get("retryable", True)))
    sleep_ms = payload.get("sleep_ms", 0)
    if isinstance(sleep_ms, (int, float)) and sleep_ms > 0:
        done = (job.progress or {}).get("slept_ms", 0) if isinstance(job.progress, dict) else 0
        step = 100
        while done < sleep_ms:
            job.sleep(min(step, sleep_ms - done) / 1000)
            done += step
            job.checkpoint({"slept_ms": min(done, sleep_ms)})
    return {"echo": job.payload, "attempt": job.attempt, "run_lease": job.run_lease}


class ApiError(Exception):
    """A non-2xx answer, with the protocol's error code."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.retry_after = retry_after


class Coordinator:
    """JSON over HTTP to one coordinator."""

    def __init__(self, url: str, key: str | None):
        self.url = url.rstrip("/")
        self.key = key

    def post(self, path: str, body: Any, timeout: float = 30.0) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.key:
            request.add_header("Authorization", f"Bearer {self.key}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                error = json.loads(raw)["error"]
                code, message = error["code"], error["message"]
            except (ValueError, KeyError, TypeError):
                code, message = "http", raw.decode(errors="replace")[:200]
            retry_after = e.headers.get("Retry-After")
            raise ApiError(e.code, code, message, float(retry_after) if retry_after else None) from None

    def post_retrying(self, path: str, body: Any, attempts: int = 5) -> Any:
        """POST, retried on transport errors and 503: for idempotent calls only."""
        delay = 0.2
        for attempt in range(attempts):
            try:
                return self.post(path, body)
            except ApiError as e:
                if e.status != 503 or attempt == attempts - 1:
                    raise
                time.sleep(e.retry_after or delay)
            except (TimeoutError, urllib.error.URLError, ConnectionError, OSError):
                if attempt == attempts - 1:
                    raise
                time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")


_log_lock = threading.Lock()


def log(message: str, **fields: Any) -> None:
    """One JSON line per event on standard error (whole lines, whichever thread logs)."""
    line = json.dumps({"ts": round(time.time(), 3), "msg": message, **fields}) + "\n"
    with _log_lock:
        sys.stderr.write(line)
        sys.stderr.flush()


class Worker:
    """Claims, runs, heartbeats and finishes jobs until stopped."""

    def __init__(
        self, api: Coordinator, queues: list[str], worker_id: str, concurrency: int, wait_ms: int, grace_s: float
    ):
        self.api = api
        self.grace_s = grace_s
        self.queues = queues
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.wait_ms = wait_ms
        self.shutdown = threading.Event()
        self.held: dict[str, Job] = {}  # lease_token -> job
        self.held_lock = threading.Lock()
        self.threads: list[threading.Thread] = []
        self.exit_code = 0

    # ---- claiming ----

    def free_slots(self) -> int:
        with self.held_lock:
            return self.concurrency - len(self.held)

    def run(self) -> None:
        heartbeat = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
        heartbeat.start()
        log("worker started", worker_id=self.worker_id, queues=self.queues, url=self.api.url)
        backoff = 0.2
        while not self.shutdown.is_set():
            slots = self.free_slots()
            if slots <= 0:
                self.shutdown.wait(0.02)
                continue
            body = {"queues": self.queues, "worker_id": self.worker_id, "max_jobs": slots, "wait_ms": self.wait_ms}
            try:
                leases = self.api.post("/v1/claim", body, timeout=self.wait_ms / 1000 + 30)["leases"]
                backoff = 0.2
            except ApiError as e:
                if e.status < 500:
                    # A wrong key, role or queue name: retrying cannot help.
                    log("claim refused; stopping", error=str(e))
                    self.exit_code = 1
                    self.shutdown.set()
                    break
                log("claim failed; retrying", error=str(e))
                self.shutdown.wait(e.retry_after or backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as e:
                log("coordinator unreachable; retrying", error=str(e))
                self.shutdown.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            self.start(leases)
        self.drain()

    def start(self, leases: list[dict[str, Any]]) -> None:
        """Runs each lease's job on its own thread (or gives it back when stopping)."""
        for lease in leases:
            job = Job(lease)
            if self.shutdown.is_set():
                # Claimed while we were stopping: give it back at once.
                self.finish(job, "release", {}, claim_next=False)
                continue
            with self.held_lock:
                self.held[job.lease_token] = job
                thread = threading.Thread(target=self.run_job, args=(job,), name=f"job-{job.job_id}")
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
            thread.start()

    # ---- running one job ----

    def run_job(self, job: Job) -> None:
        log("job claimed", job_id=job.job_id, run_lease=job.run_lease, attempt=job.attempt)
        try:
            result = handle(job)
            outcome: tuple[str, dict[str, Any]] = ("complete", {"result": result})
        except JobFailed as e:
            body: dict[str, Any] = {"error": str(e), "retryable": e.retryable}
            if e.retry_after_ms is not None:
                body["retry_after_ms"] = e.retry_after_ms
            outcome = ("fail", body)
        except Stopped:
            outcome = ("stopped", {})
        except Exception as e:  # noqa: BLE001 - any handler error fails the attempt
            outcome = ("fail", {"error": f"{type(e).__name__}: {e}", "retryable": True})
        reason = job.stop_reason
        if reason in ("lease_lost", "no_heartbeat"):
            # Someone else may hold the job now: whatever the handler did,
            # nothing is sent (it would be refused); the coordinator decides.
            log("job dropped", job_id=job.job_id, run_lease=job.run_lease, reason=reason)
            outcome = ("drop", {})
        elif outcome[0] == "stopped":
            # The handler stopped before its end: acknowledge why.
            if reason == "cancel_requested":
                outcome = ("fail", {"error": "cancel requested; the handler stopped", "retryable": False})
            elif reason == "timeout":
                outcome = ("fail", {"error": "the attempt passed its timeout_ms", "retryable": True})
            else:  # shutdown
                outcome = ("release", {"progress": job.progress} if job.progress is not None else {})
        # A handler that finished anyway (a cancel or shutdown came too late)
        # reports its outcome: a complete still lands as done.
        if outcome[0] != "drop":
            self.finish(job, outcome[0], outcome[1])
        with self.held_lock:
            self.held.pop(job.lease_token, None)

    def finish(self, job: Job, action: str, body: dict[str, Any], claim_next: bool = True) -> None:
        """Ends the attempt with one `POST /v1/finish`; unless stopping, the same
        request claims the next job for the slot this one frees (the claim is
        made once the outcome is committed), so a busy worker spends one
        request per job."""
        request: dict[str, Any] = {"items": [{"lease_token": job.lease_token, "action": action, **body}]}
        if claim_next and not self.shutdown.is_set():
            request["claim"] = {"queues": self.queues, "worker_id": self.worker_id, "max_jobs": 1, "wait_ms": 0}
        try:
            answer = self.api.post_retrying("/v1/finish", request)
            item = answer["items"][0]
            if item["status"] == "lease_lost":
                log("finish refused: lease lost", job_id=job.job_id, run_lease=job.run_lease, action=action)
            else:
                done = {"complete": "job completed", "fail": "job failed", "release": "job released"}[action]
                log(done, job_id=job.job_id, run_lease=job.run_lease, state=item["state"])
            self.start(answer.get("leases") or [])
        except ApiError as e:
            log("finish failed", job_id=job.job_id, action=action, error=str(e))
        except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as e:
            log("finish failed: coordinator unreachable", job_id=job.job_id, action=action, error=str(e))

    # ---- heartbeats ----

    def heartbeat_loop(self) -> None:
        """One heartbeat request per interval for every held lease."""
        while True:
            with self.held_lock:
                jobs = list(self.held.values())
            if not jobs:
                time.sleep(0.05)
                continue
            time.sleep(min(job.heartbeat_interval_s for job in jobs))
            with self.held_lock:
                jobs = list(self.held.values())
            if jobs:
                try:
                    self.heartbeat(jobs)
                except Exception as e:  # noqa: BLE001 - the loop must outlive one bad answer
                    log("heartbeat answer not understood", error=repr(e))

    def heartbeat(self, jobs: list[Job]) -> None:
        items = []
        sent = []
        for job in jobs:
            item: dict[str, Any] = {"lease_token": job.lease_token}
            progress = job.pending_checkpoint()
            if progress is not None:
                item["progress"] = progress
            items.append(item)
            sent.append(progress)
        try:
            answer = self.api.post("/v1/heartbeat", {"leases": items}, timeout=10)
        except (TimeoutError, ApiError, urllib.error.URLError, ConnectionError, OSError) as e:
            log("heartbeat failed", error=str(e), leases=len(jobs))
            now = time.monotonic()
            for job in jobs:
                # Self-fencing: a lease not renewed for a whole TTL may be gone.
                if now - job.renewed_at >= job.lease_ttl_s:
                    job.stop("no_heartbeat")
            return
        now = time.monotonic()
        for job, progress, result in zip(jobs, sent, answer["leases"]):
            job.checkpoint_sent(progress)
            status = result["status"]
            if status in ("renewed", "cancel_requested"):
                job.renewed_at = now
            if status == "cancel_requested":
                log("cancel requested", job_id=job.job_id, run_lease=job.run_lease)
                job.stop("cancel_requested")
            elif status == "lease_lost":
                log("lease lost", job_id=job.job_id, run_lease=job.run_lease)
                job.stop("lease_lost")
            job.stopping()  # stops a handler past its timeout even if it never checks

    # ---- shutdown ----

    def drain(self) -> None:
        """Lets handlers finish for the grace period, then stops and releases the rest."""
        log("draining", held=len(self.held), grace_s=self.grace_s)
        end = time.monotonic() + self.grace_s
        for thread in self.threads:
            thread.join(max(0.0, end - time.monotonic()))
        with self.held_lock:
            for job in self.held.values():
                job.stop("shutdown")
        for thread in self.threads:
            thread.join()
        log("worker stopped")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("RUNLEASE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--key", default=os.environ.get("RUNLEASE_KEY"), help="a worker API key")
    parser.add_argument(
        "--queue",
        action="append",
        dest="queues",
        help="a queue to claim from (repeatable; default RUNLEASE_QUEUES or 'default')",
    )
    parser.add_argument(
        "--worker-id", default=os.environ.get("RUNLEASE_WORKER_ID", f"py-{socket.gethostname()}-{os.getpid()}")
    )
    parser.add_argument("--concurrency", type=int, default=4, help="jobs held at once")
    parser.add_argument("--wait-ms", type=int, default=10_000, help="claim long-poll (0..60000)")
    parser.add_argument(
        "--grace-ms",
        type=int,
        default=10_000,
        help="on SIGTERM, how long running handlers may go on before they are stopped and released",
    )
    args = parser.parse_args()
    queues = args.queues or os.environ.get("RUNLEASE_QUEUES", "default").split(",")
    worker = Worker(
        Coordinator(args.url, args.key),
        [q.strip() for q in queues if q.strip()],
        args.worker_id,
        max(1, args.concurrency),
        args.wait_ms,
        args.grace_ms / 1000,
    )

    def stop(signum: int, _frame: Any) -> None:
        log("signal received; stopping", signal=signal.Signals(signum).name)
        worker.shutdown.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run()
    return worker.exit_code


if __name__ == "__main__":
    sys.exit(main())
