"""The asyncio pull worker: a task per handler, heartbeats and finishes as tasks beside them."""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import httpx

from ._http import AsyncApi
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
from .worker import MAX_FINISH_ITEMS, STOP_TIMEOUT_S, WATCH_EVERY_S, default_worker_id

#: An asyncio handler (a blocking one runs in a thread). When the handler must
#: stop, its task is cancelled and `attempt.signal` is set.
AsyncHandler = Callable[[Attempt], Union[Awaitable[Any], Any]]


@dataclass
class _Held:
    attempt: Attempt
    task: Optional["asyncio.Task[None]"] = None
    finishing: bool = False
    lost: bool = False
    abandoned: bool = False
    cancelled_by_us: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)


class AsyncWorker:
    """The asyncio form of `Worker`: `await worker.run()` until `worker.stop()`.

    An async handler is cancelled (`asyncio.CancelledError` at its next
    `await`) when it must stop, and `attempt.reason` says why; a blocking
    handler runs in a thread and checks `attempt.signal`.
    """

    def __init__(
        self,
        url: str,
        queues: Sequence[str],
        handler: AsyncHandler,
        *,
        key: Optional[str] = None,
        worker_id: Optional[str] = None,
        concurrency: int = 8,
        wait_ms: int = 10_000,
        grace: float = 10.0,
        http: Optional[httpx.AsyncClient] = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.queues = list(queues)
        self.handler = handler
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.wait_ms = wait_ms
        self.grace = grace
        self._api = AsyncApi(url, key, http)
        self._held: Dict[str, _Held] = {}
        self._reserved = 0
        self._outbox: List[Tuple[_Held, Dict[str, Any]]] = []
        self._sending = 0
        self._changed: Optional[asyncio.Event] = None
        self._stopping: Optional[asyncio.Event] = None
        self._closed = False
        self._error: Optional[ApiError] = None
        self._strip_progress = False
        self._tasks: Set["asyncio.Task[Any]"] = set()

    def stop(self) -> None:
        """Asks the worker to drain (call it from the worker's event loop)."""
        if self._stopping is not None:
            self._stopping.set()
            self._notify()

    @property
    def held(self) -> int:
        """Leases held now."""
        return len(self._held)

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _changes(self, timeout: Optional[float]) -> None:
        """Waits until something changed, or `timeout` seconds."""
        assert self._changed is not None
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self._changed.clear()

    def _spawn(self, coro: Awaitable[Any]) -> "asyncio.Task[Any]":
        task: "asyncio.Task[Any]" = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def run(self) -> None:
        """Runs until stopped, then drains; raises a claim's refusal (401, 403, 422) after the drain."""
        self._changed = asyncio.Event()
        self._stopping = asyncio.Event()
        event("worker started", worker_id=self.worker_id, queues=self.queues)
        loops = [asyncio.ensure_future(c) for c in (self._heartbeat_loop(), self._watch_loop(), self._finish_loop())]
        claimer = asyncio.ensure_future(self._claim_loop())
        await self._stopping.wait()
        await self._drain(claimer)
        self._closed = True
        self._notify()
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await self._api.close()
        event("worker stopped", worker_id=self.worker_id)
        if self._error is not None:
            raise self._error

    # ---- claiming ----

    async def _claim_loop(self) -> None:
        assert self._stopping is not None
        backoff = 0.2
        while not self._stopping.is_set():
            n = self.concurrency - len(self._held) - self._reserved
            if n <= 0:
                await self._changes(0.5)
                continue
            self._reserved += n
            body = {"queues": self.queues, "worker_id": self.worker_id, "max_jobs": n, "wait_ms": self.wait_ms}
            sent = time.monotonic()
            try:
                answer = await self._api.call("POST", "/v1/claim", body, timeout=self.wait_ms / 1000 + 30)
                backoff = 0.2
                self._start(answer.get("leases") or [], sent, time.monotonic())
            except ApiError as e:
                if e.status == 429 or e.status >= 500:
                    event("claim failed; retrying", error=str(e))
                    await self._pause(max(e.retry_after or 0, backoff * random.uniform(0.5, 1.0)))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                else:
                    event("claim refused; stopping", error=str(e))
                    self._error = e
                    self.stop()
            except Unreachable as e:
                event("coordinator unreachable; retrying", error=str(e))
                await self._pause(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, MAX_BACKOFF_S)
            finally:
                self._reserved -= n
                self._notify()

    async def _pause(self, seconds: float) -> None:
        assert self._stopping is not None
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    def _start(self, leases: List[Dict[str, Any]], sent: float, arrived: float) -> None:
        assert self._stopping is not None
        for lease in leases:
            attempt = Attempt(lease, grant_instant(sent, arrived, int(lease["lease_ttl_ms"]) / 1000))
            held = _Held(attempt)
            self._held[attempt.lease_token] = held
            if self._stopping.is_set():
                held.finishing = True
                self._outbox.append((held, {"action": "release", "lease_token": attempt.lease_token}))
                continue
            event("job claimed", job_id=attempt.job_id, run_lease=attempt.run_lease, attempt=attempt.attempt)
            held.task = self._spawn(self._run_handler(held))
        self._notify()

    # ---- running ----

    async def _run_handler(self, held: _Held) -> None:
        attempt = held.attempt
        try:
            if inspect.iscoroutinefunction(self.handler):
                value = await self.handler(attempt)
            else:
                value = await asyncio.get_running_loop().run_in_executor(None, self.handler, attempt)
                if inspect.isawaitable(value):
                    value = await value
            outcome = outcome_of_result(value)
        except asyncio.CancelledError:
            if not held.cancelled_by_us:
                raise
            outcome = None
        except Exception as e:  # noqa: BLE001 - any handler error ends the attempt
            outcome = outcome_of_exception(e)
        if held.abandoned:
            return
        self._settle(held, decide(outcome, attempt))

    def _settle(self, held: _Held, item: Optional[Dict[str, Any]]) -> None:
        attempt = held.attempt
        if item is None:
            event("job dropped", job_id=attempt.job_id, run_lease=attempt.run_lease, reason=attempt.reason)
            self._held.pop(attempt.lease_token, None)
        else:
            held.finishing = True
            self._outbox.append((held, item))
        self._notify()

    def _ask_stop(self, held: _Held, reason: str) -> None:
        attempt = held.attempt
        if attempt.stop(reason):
            messages = {LEASE_LOST: "lease lost", CANCEL_REQUESTED: "cancel requested",
                        UNREACHABLE: "coordinator unreachable for a lease TTL; lease fenced",
                        SHUTDOWN: "stopping for shutdown"}
            event(messages.get(reason, reason), job_id=attempt.job_id, run_lease=attempt.run_lease)
            if held.task is not None and not held.finishing and inspect.iscoroutinefunction(self.handler):
                held.cancelled_by_us = True
                held.task.cancel()

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            now = time.monotonic()
            for held in list(self._held.values()):
                a = held.attempt
                if not a.fenced and now - a.renewed_at >= a.lease_ttl_s:
                    self._ask_stop(held, UNREACHABLE)

    # ---- heartbeats ----

    async def _heartbeat_loop(self) -> None:
        while True:
            live = [h for h in self._held.values() if not h.lost and not h.attempt.fenced]
            await asyncio.sleep(min((h.attempt.heartbeat_interval_s for h in live), default=0.2))
            live = [h for h in self._held.values() if not h.lost and not h.attempt.fenced]
            for start in range(0, len(live), MAX_FINISH_ITEMS):
                # A hung request must not hold back the next interval: each round is a task.
                self._spawn(self._heartbeat(live[start:start + MAX_FINISH_ITEMS]))

    async def _heartbeat(self, helds: List[_Held]) -> None:
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
            answer = await self._api.call("POST", "/v1/heartbeat", {"leases": items}, timeout=ttl)
        except Invalid as e:
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

    async def _finish_loop(self) -> None:
        while True:
            if not self._outbox:
                await self._changes(None)
                continue
            batch = self._outbox[:MAX_FINISH_ITEMS]
            del self._outbox[:MAX_FINISH_ITEMS]
            self._sending += 1
            try:
                await self._finish(batch, claim=True)
            finally:
                self._sending -= 1
                self._notify()

    async def _finish(self, batch: List[Tuple[_Held, Dict[str, Any]]], *, claim: bool) -> None:
        assert self._stopping is not None
        n = 0
        if claim and self.queues and not self._stopping.is_set():
            n = max(0, self.concurrency - (len(self._held) - len(batch)) - self._reserved)
            self._reserved += n
        try:
            backoff = 0.2
            while True:
                for held, _ in batch:
                    if held.attempt.fenced:
                        event("job dropped", job_id=held.attempt.job_id, run_lease=held.attempt.run_lease,
                              reason=held.attempt.reason)
                        self._held.pop(held.attempt.lease_token, None)
                batch = [(h, i) for h, i in batch if not h.attempt.fenced]
                if not batch:
                    return
                body: Dict[str, Any] = {"items": [i for _, i in batch]}
                if n:
                    body["claim"] = {"queues": self.queues, "worker_id": self.worker_id, "max_jobs": n,
                                     "wait_ms": 0}
                sent = time.monotonic()
                try:
                    answer = await self._api.call("POST", "/v1/finish", body)
                except (BadRequest, Invalid, TooLarge) as e:
                    if len(batch) > 1:
                        for one in batch:
                            await self._finish([one], claim=False)
                        return
                    self._forget(batch, f"finish refused: {e}")
                    return
                except ApiError as e:
                    if e.status != 429 and e.status < 500:
                        self._forget(batch, f"finish refused: {e}")
                        return
                    event("finish failed; repeating", error=str(e))
                    await asyncio.sleep(min(max(e.retry_after or 0, backoff), MAX_BACKOFF_S))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                except Unreachable as e:
                    event("finish answer lost; repeating", error=str(e))
                    await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                    backoff = min(backoff * 2, MAX_BACKOFF_S)
                    continue
                self._answered(batch, answer["items"])
                self._start(answer.get("leases") or [], sent, time.monotonic())
                return
        finally:
            self._reserved -= n
            self._notify()

    def _answered(self, batch: List[Tuple[_Held, Dict[str, Any]]], answers: List[Dict[str, Any]]) -> None:
        done = {"complete": "job completed", "fail": "job failed", "release": "job released"}
        for (held, item), answer in zip(batch, answers):
            a = held.attempt
            if answer["status"] == "lease_lost":
                event("finish refused: lease lost", job_id=a.job_id, run_lease=a.run_lease, action=item["action"])
            else:
                event(done[item["action"]], job_id=a.job_id, run_lease=a.run_lease, state=answer["state"])
            self._held.pop(a.lease_token, None)
        self._notify()

    def _forget(self, batch: List[Tuple[_Held, Dict[str, Any]]], why: str) -> None:
        for held, item in batch:
            event(why, job_id=held.attempt.job_id, run_lease=held.attempt.run_lease, action=item["action"])
            self._held.pop(held.attempt.lease_token, None)
        self._notify()

    # ---- shutdown ----

    def _running(self) -> List[_Held]:
        return [h for h in self._held.values() if not h.finishing]

    async def _wait_until(self, done: Callable[[], bool], timeout: Optional[float]) -> None:
        end = None if timeout is None else time.monotonic() + timeout
        while not done():
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return
            await self._changes(0.5 if left is None else min(left, 0.5))

    async def _drain(self, claimer: "asyncio.Future[None]") -> None:
        event("draining", held=len(self._held), grace_s=self.grace)
        await self._wait_until(lambda: not self._running(), self.grace)
        for held in self._running():
            self._ask_stop(held, SHUTDOWN)
        await self._wait_until(lambda: not self._running(), STOP_TIMEOUT_S)
        for held in self._running():
            held.abandoned = True
            self._settle(held, decide(None, held.attempt))
        await claimer
        await self._wait_until(lambda: not (self._held or self._outbox or self._sending), None)
