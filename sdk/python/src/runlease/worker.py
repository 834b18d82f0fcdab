"""The blocking pull worker: a thread per handler, heartbeats and finishes in the background."""

from __future__ import annotations

import os
import queue
import random
import signal
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import httpx

from ._http import SyncApi
from .attempt import (
    CANCEL_REQUESTED,
    LEASE_LOST,
    MAX_BACKOFF_S,
    SHUTDOWN,
    UNREACHABLE,
    Attempt,
    decide,
    event,
    grant_instant,
    outcome_of_exception,
    outcome_of_result,
)
from .errors import ApiError, BadRequest, Invalid, TooLarge, Unreachable

#: A blocking handler: answers the job's result, or raises (`JobFailed`, `ReleaseJob`, ...).
Handler = Callable[[Attempt], Any]

#: How often leases are checked for their fence and their timeout, in seconds.
WATCH_EVERY_S = 0.05
#: How long a stopped handler may take to return at shutdown before it is released for it.
STOP_TIMEOUT_S = 1.0
#: The most items one `POST /v1/finish` carries.
MAX_FINISH_ITEMS = 1000


def default_worker_id() -> str:
    """`py-<host>-<pid>`: unique among the workers of one fleet."""
    return f"py-{socket.gethostname()}-{os.getpid()}"[:128]


class _Handlers:
    """Daemon threads that run handlers, started as needed and reused.

    Starting a thread per job costs more than a short job, and under load
    each start waits for the GIL: reused threads keep a busy worker's rate.
    Daemon threads, so a handler that ignores its stop cannot hold the
    process open after the drain gave up on it.
    """

    def __init__(self, run: Callable[["_Held"], None]) -> None:
        self._run = run
        self._jobs: "queue.SimpleQueue[Optional[_Held]]" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads = 0

    def submit(self, held: "_Held") -> None:
        with self._lock:
            start = self._idle == 0
            if start:
                self._threads += 1
            else:
                self._idle -= 1
        if start:
            threading.Thread(target=self._loop, name=f"runlease-handler-{self._threads}", daemon=True).start()
        self._jobs.put(held)

    def _loop(self) -> None:
        while True:
            held = self._jobs.get()
            if held is None:
                return
            try:
                self._run(held)
            except BaseException:
                # Not an idle thread any more (SystemExit from a handler, say).
                with self._lock:
                    self._threads -= 1
                raise
            with self._lock:
                self._idle += 1

    def close(self) -> None:
        """Ends the idle threads (a handler still running ends its thread when it returns)."""
        with self._lock:
            n, self._threads, self._idle = self._threads, 0, 0
        for _ in range(n):
            self._jobs.put(None)


@dataclass
class _Held:
    attempt: Attempt
    finishing: bool = False
    lost: bool = False
    abandoned: bool = False


class Worker:
    """Claims jobs of `queues` and runs `handler` on each, up to `concurrency` at once.

    `run()` blocks until `stop()` (or SIGTERM/SIGINT with `handle_signals`),
    then drains: stops claiming, lets handlers finish for `grace` seconds,
    stops the rest and releases them with their checkpoint, and returns once
    every outcome is answered. A claim refused for good (a wrong key, role or
    queue: 401, 403, 422) stops the worker and `run()` raises it after the drain.
    """

    def __init__(
        self,
        url: str,
        queues: Sequence[str],
        handler: Handler,
        *,
        key: Optional[str] = None,
        worker_id: Optional[str] = None,
        concurrency: int = 8,
        wait_ms: int = 10_000,
        grace: float = 10.0,
        http: Optional[httpx.Client] = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.queues = list(queues)
        self.handler = handler
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.wait_ms = wait_ms
        self.grace = grace
        self._api = SyncApi(url, key, http)
        self._cond = threading.Condition()
        self._held: Dict[str, _Held] = {}
        self._reserved = 0
        self._outbox: List[Tuple[_Held, Dict[str, Any]]] = []
        self._sending = 0
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self._error: Optional[ApiError] = None
        self._strip_progress = False
        self._handlers = _Handlers(self._run_handler)

    # ---- public ----

    def stop(self) -> None:
        """Asks the worker to drain; `run()` returns once it has."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    @property
    def held(self) -> int:
        """Leases held now (running, or waiting for their outcome's answer)."""
        with self._cond:
            return len(self._held)

    def run(self, *, handle_signals: bool = False) -> None:
        """Runs until stopped, then drains. See the class's documentation."""
        if handle_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, _frame: self.stop())
        event("worker started", worker_id=self.worker_id, queues=self.queues)
        loops = [
            threading.Thread(target=self._heartbeat_loop, name="runlease-heartbeat", daemon=True),
            threading.Thread(target=self._watch_loop, name="runlease-watch", daemon=True),
            threading.Thread(target=self._finish_loop, name="runlease-finish", daemon=True),
        ]
        for t in loops:
            t.start()
        claimer = threading.Thread(target=self._claim_loop, name="runlease-claim", daemon=True)
        claimer.start()
        while not self._stopping.wait(0.2):
            pass
        self._drain(claimer)
        self._closed.set()
        with self._cond:
            self._cond.notify_all()
        for t in loops:
            t.join()
        self._api.close()
        self._handlers.close()
        event("worker stopped", worker_id=self.worker_id)
        if self._error is not None:
            raise self._error

    # ---- claiming ----

    def _claim_loop(self) -> None:
        backoff = 0.2
        while not self._stopping.is_set():
            with self._cond:
                n = self.concurrency - len(self._held) - self._reserved
                if n <= 0:
                    self._cond.wait(0.5)
                    continue
                self._reserved += n
            body = {"queues": self.queues, "worker_id": self.worker_id, "max_jobs": n, "wait_ms": self.wait_ms}
            sent = time.monotonic()
            try:
                answer = self._api.call("POST", "/v1/claim", body, timeout=self.wait_ms / 1000 + 30)
                backoff = 0.2
                self._start(answer.get("leases") or [], sent, time.monotonic())
            except ApiError as e:
                if e.status == 429 or e.status >= 500:
                    event("claim failed; retrying", error=str(e))
                    self._stopping.wait(max(e.retry_after or 0, backoff * random.uniform(0.5, 1.0)))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                else:
                    event("claim refused; stopping", error=str(e))
                    self._error = e
                    self.stop()
            except Unreachable as e:
                event("coordinator unreachable; retrying", error=str(e))
                self._stopping.wait(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            finally:
                with self._cond:
                    self._reserved -= n
                    self._cond.notify_all()

    def _start(self, leases: List[Dict[str, Any]], sent: float, arrived: float) -> None:
        for lease in leases:
            attempt = Attempt(lease, grant_instant(sent, arrived, int(lease["lease_ttl_ms"]) / 1000))
            held = _Held(attempt)
            with self._cond:
                self._held[attempt.lease_token] = held
                if self._stopping.is_set():
                    # Claimed while draining: give it back at once, unrun.
                    held.finishing = True
                    self._outbox.append((held, {"action": "release", "lease_token": attempt.lease_token}))
                    self._cond.notify_all()
                    continue
            event("job claimed", job_id=attempt.job_id, run_lease=attempt.run_lease, attempt=attempt.attempt)
            self._handlers.submit(held)

    # ---- running ----

    def _run_handler(self, held: _Held) -> None:
        attempt = held.attempt
        try:
            outcome = outcome_of_result(self.handler(attempt))
        except Exception as e:  # noqa: BLE001 - any handler error ends the attempt
            outcome = outcome_of_exception(e)
        with self._cond:
            if held.abandoned:
                return
            self._settle(held, decide(outcome, attempt))

    def _settle(self, held: _Held, item: Optional[Dict[str, Any]]) -> None:
        """With the lock held: queues the attempt's finish item, or drops the job."""
        attempt = held.attempt
        if item is None:
            event("job dropped", job_id=attempt.job_id, run_lease=attempt.run_lease, reason=attempt.reason)
            self._held.pop(attempt.lease_token, None)
        else:
            held.finishing = True
            self._outbox.append((held, item))
        self._cond.notify_all()

    def _ask_stop(self, held: _Held, reason: str) -> None:
        attempt = held.attempt
        if attempt.stop(reason):
            messages = {LEASE_LOST: "lease lost", CANCEL_REQUESTED: "cancel requested",
                        UNREACHABLE: "coordinator unreachable for a lease TTL; lease fenced",
                        SHUTDOWN: "stopping for shutdown"}
            event(messages.get(reason, reason), job_id=attempt.job_id, run_lease=attempt.run_lease)

    def _watch_loop(self) -> None:
        """Fences leases not renewed for a whole TTL.

        A handler past its attempt's timeout is not stopped here: the
        coordinator answers its next heartbeat `lease_lost`, and the reaper
        decides the attempt, so nothing is sent for it.
        """
        while not self._closed.wait(WATCH_EVERY_S):
            now = time.monotonic()
            with self._cond:
                helds = list(self._held.values())
            for held in helds:
                a = held.attempt
                if not a.fenced and now - a.renewed_at >= a.lease_ttl_s:
                    self._ask_stop(held, UNREACHABLE)

    # ---- heartbeats ----

    def _heartbeat_loop(self) -> None:
        while True:
            with self._cond:
                live = [h for h in self._held.values() if not h.lost and not h.attempt.fenced]
            interval = min((h.attempt.heartbeat_interval_s for h in live), default=0.2)
            if self._closed.wait(interval):
                return
            with self._cond:
                live = [h for h in self._held.values() if not h.lost and not h.attempt.fenced]
            for start in range(0, len(live), MAX_FINISH_ITEMS):
                self._heartbeat(live[start:start + MAX_FINISH_ITEMS])

    def _heartbeat(self, helds: List[_Held]) -> None:
        items: List[Dict[str, Any]] = []
        carried: List[Any] = []
        for held in helds:
            item: Dict[str, Any] = {"lease_token": held.attempt.lease_token}
            progress = None if self._strip_progress else held.attempt.take_checkpoint()
            if progress is not None:
                item["progress"] = progress
            items.append(item)
            carried.append(progress)
        self._strip_progress = False
        sent = time.monotonic()
        try:
            ttl = min(h.attempt.lease_ttl_s for h in helds)
            answer = self._api.call("POST", "/v1/heartbeat", {"leases": items}, timeout=ttl)
        except Invalid as e:
            # A checkpoint that cannot be stored: renew without checkpoints next time.
            event("heartbeat refused; sending renewals without checkpoints", error=str(e))
            self._strip_progress = True
            return
        except (ApiError, Unreachable) as e:
            event("heartbeat failed", error=str(e), leases=len(helds))
            return
        for held, progress, result in zip(helds, carried, answer["leases"]):
            held.attempt.checkpoint_sent(progress)
            status = result["status"]
            if status in ("renewed", "cancel_requested"):
                held.attempt.renewed_at = max(held.attempt.renewed_at, sent)
                held.attempt.renewals += 1
            if status == "cancel_requested":
                self._ask_stop(held, CANCEL_REQUESTED)
            elif status == "lease_lost":
                held.lost = True
                if not held.finishing:
                    self._ask_stop(held, LEASE_LOST)

    # ---- finishing ----

    def _finish_loop(self) -> None:
        while True:
            with self._cond:
                while not self._outbox and not self._closed.is_set():
                    self._cond.wait()
                if not self._outbox:
                    return
                batch = self._outbox[:MAX_FINISH_ITEMS]
                del self._outbox[:MAX_FINISH_ITEMS]
                self._sending += 1
            try:
                self._finish(batch, claim=True)
            finally:
                with self._cond:
                    self._sending -= 1
                    self._cond.notify_all()

    def _finish(self, batch: List[Tuple[_Held, Dict[str, Any]]], *, claim: bool) -> None:
        """Sends one `POST /v1/finish` (with a claim for the slots it frees), repeated until answered."""
        n = 0
        with self._cond:
            if claim and self.queues and not self._stopping.is_set():
                n = max(0, self.concurrency - (len(self._held) - len(batch)) - self._reserved)
                self._reserved += n
        try:
            backoff = 0.2
            while True:
                with self._cond:
                    for held, _ in batch:
                        if held.attempt.fenced and held.finishing:
                            event("job dropped", job_id=held.attempt.job_id, run_lease=held.attempt.run_lease,
                                  reason=held.attempt.reason)
                            self._held.pop(held.attempt.lease_token, None)
                    batch = [(h, i) for h, i in batch if not h.attempt.fenced]
                    self._cond.notify_all()
                if not batch:
                    return
                body: Dict[str, Any] = {"items": [i for _, i in batch]}
                if n:
                    body["claim"] = {"queues": self.queues, "worker_id": self.worker_id, "max_jobs": n,
                                     "wait_ms": 0}
                sent = time.monotonic()
                try:
                    answer = self._api.call("POST", "/v1/finish", body)
                except (BadRequest, Invalid, TooLarge) as e:
                    if len(batch) > 1:
                        for one in batch:
                            self._finish([one], claim=False)
                        return
                    self._forget(batch, f"finish refused: {e}")
                    return
                except ApiError as e:
                    if e.status != 429 and e.status < 500:
                        self._forget(batch, f"finish refused: {e}")
                        return
                    event("finish failed; repeating", error=str(e))
                    time.sleep(min(max(e.retry_after or 0, backoff), MAX_BACKOFF_S))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                except Unreachable as e:
                    event("finish answer lost; repeating", error=str(e))
                    time.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                self._answered(batch, answer["items"])
                self._start(answer.get("leases") or [], sent, time.monotonic())
                return
        finally:
            with self._cond:
                self._reserved -= n
                self._cond.notify_all()

    def _answered(self, batch: List[Tuple[_Held, Dict[str, Any]]], answers: List[Dict[str, Any]]) -> None:
        done = {"complete": "job completed", "fail": "job failed", "release": "job released"}
        with self._cond:
            for (held, item), answer in zip(batch, answers):
                a = held.attempt
                if answer["status"] == "lease_lost":
                    event("finish refused: lease lost", job_id=a.job_id, run_lease=a.run_lease, action=item["action"])
                else:
                    event(done[item["action"]], job_id=a.job_id, run_lease=a.run_lease, state=answer["state"])
                self._held.pop(a.lease_token, None)
            self._cond.notify_all()

    def _forget(self, batch: List[Tuple[_Held, Dict[str, Any]]], why: str) -> None:
        with self._cond:
            for held, item in batch:
                event(why, job_id=held.attempt.job_id, run_lease=held.attempt.run_lease, action=item["action"])
                self._held.pop(held.attempt.lease_token, None)
            self._cond.notify_all()

    # ---- shutdown ----

    def _running(self) -> List[_Held]:
        return [h for h in self._held.values() if not h.finishing]

    def _drain(self, claimer: threading.Thread) -> None:
        with self._cond:
            event("draining", held=len(self._held), grace_s=self.grace)
            end = time.monotonic() + self.grace
            while self._running() and time.monotonic() < end:
                self._cond.wait(end - time.monotonic())
            running = self._running()
        for held in running:
            self._ask_stop(held, SHUTDOWN)
        with self._cond:
            end = time.monotonic() + STOP_TIMEOUT_S
            while self._running() and time.monotonic() < end:
                self._cond.wait(end - time.monotonic())
            for held in self._running():
                # The handler did not stop in time: its outcome is decided without it.
                held.abandoned = True
                self._settle(held, decide(None, held.attempt))
        claimer.join()
        with self._cond:
            while self._held or self._outbox or self._sending:
                self._cond.wait(0.5)
