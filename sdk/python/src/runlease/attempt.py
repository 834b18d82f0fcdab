"""One running attempt as its handler sees it, and how its end becomes an outcome."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from .errors import JobFailed, ReleaseJob, RetryLater, Stopped

log = logging.getLogger("runlease")

#: Why a handler is asked to stop (`Attempt.reason`).
LEASE_LOST = "lease_lost"
CANCEL_REQUESTED = "cancel_requested"
UNREACHABLE = "unreachable"
TIMEOUT = "timeout"
SHUTDOWN = "shutdown"

#: Reasons after which nothing more is sent for the lease.
FENCED = frozenset({LEASE_LOST, UNREACHABLE})

#: The longest `Retry-After` worth waiting for between finish repeats, in seconds.
MAX_BACKOFF_S = 5.0


def event(message: str, **fields: Any) -> None:
    """Logs one event of the library; its fields ride in `record.runlease`."""
    log.info(message, extra={"runlease": fields})


class Attempt:
    """A claimed job for the length of one attempt: `(job_id, run_lease)` names it.

    `signal` is set when the handler must stop; `reason` says why:
    `lease_lost`, `cancel_requested`, `unreachable` (no heartbeat answer for a
    whole lease TTL: the worker fenced itself), `timeout` or `shutdown`. After
    `lease_lost` and `unreachable` nothing the handler returns is sent.
    """

    def __init__(self, lease: Mapping[str, Any], granted_at: Optional[float] = None) -> None:
        self.job_id: str = str(lease["job_id"])
        self.run_lease: int = int(lease["run_lease"])
        self.lease_token: str = str(lease["lease_token"])
        self.queue: str = str(lease.get("queue", ""))
        self.payload: Any = lease.get("payload")
        self.attempt: int = int(lease.get("attempt", 1))
        #: The checkpoint an earlier attempt saved (or this one, once `checkpoint` is called).
        self.progress: Any = lease.get("progress")
        self.traceparent: Optional[str] = lease.get("traceparent")
        self.dependencies: Optional[List[Dict[str, Any]]] = lease.get("dependencies")
        self.lease_ttl_s: float = int(lease["lease_ttl_ms"]) / 1000
        self.heartbeat_interval_s: float = int(lease["heartbeat_interval_ms"]) / 1000
        timeout_ms = lease.get("timeout_ms")
        now = time.monotonic()
        granted = now if granted_at is None else granted_at
        #: Monotonic instant the attempt passes its `timeout_ms` (None: no limit known).
        self.deadline: Optional[float] = None if timeout_ms is None else granted + int(timeout_ms) / 1000
        #: Monotonic instant of the grant, then of the send of the last successful heartbeat.
        self.renewed_at: float = granted
        #: Heartbeats of this lease answered `renewed` (or `cancel_requested`) so far.
        self.renewals: int = 0
        self.signal = threading.Event()
        self.reason: Optional[str] = None
        self._lock = threading.Lock()
        self._checkpoint: Any = None
        self._has_checkpoint = False
        self._on_stop: List[Callable[[str], None]] = []

    @property
    def stopped(self) -> bool:
        """Whether the handler has been asked to stop."""
        return self.signal.is_set()

    def check(self) -> None:
        """Raises `Stopped` once the handler must stop."""
        if self.signal.is_set():
            raise Stopped(self.reason or "stopped")

    def sleep(self, seconds: float) -> None:
        """Sleeps, waking at once with `Stopped` when the handler must stop."""
        if self.signal.wait(seconds):
            raise Stopped(self.reason or "stopped")

    def checkpoint(self, progress: Any) -> None:
        """Saves `progress`: the next heartbeat carries it, and a release at shutdown keeps it."""
        with self._lock:
            self._checkpoint = progress
            self._has_checkpoint = True
            self.progress = progress

    def on_stop(self, callback: Callable[[str], None]) -> None:
        """Calls `callback(reason)` when the handler is asked to stop (at once if it was)."""
        with self._lock:
            if self.reason is None:
                self._on_stop.append(callback)
                return
            reason = self.reason
        callback(reason)

    # ---- for the runtimes ----

    def stop(self, reason: str) -> bool:
        """Asks the handler to stop; the first reason wins. Answers whether this call set it."""
        with self._lock:
            if self.reason is not None:
                return False
            self.reason = reason
            callbacks, self._on_stop = self._on_stop, []
        self.signal.set()
        for callback in callbacks:
            callback(reason)
        return True

    @property
    def fenced(self) -> bool:
        """Whether nothing more may be sent for this lease."""
        return self.reason in FENCED

    def take_checkpoint(self) -> Any:
        """The checkpoint not yet sent (or None), for a heartbeat."""
        with self._lock:
            return self._checkpoint if self._has_checkpoint else None

    def checkpoint_sent(self, progress: Any) -> None:
        """Forgets `progress` once a heartbeat carried it, unless a newer one came."""
        with self._lock:
            if self._has_checkpoint and self._checkpoint is progress:
                self._checkpoint = None
                self._has_checkpoint = False


#: A handler's end: the finish item it asks for (without `lease_token`), or None when it stopped.
Outcome = Optional[Dict[str, Any]]


def outcome_of_result(result: Any) -> Outcome:
    """The outcome of a handler that returned `result`."""
    return {"action": "complete", "result": result}


def outcome_of_exception(error: BaseException) -> Outcome:
    """The outcome of a handler that raised `error`."""
    if isinstance(error, JobFailed):
        item: Dict[str, Any] = {"action": "fail", "error": error.message, "retryable": error.retryable}
        if error.retry_after_ms is not None:
            item["retry_after_ms"] = error.retry_after_ms
        return item
    if isinstance(error, RetryLater):
        return {"action": "fail", "error": str(error), "retryable": True, "retry_after_ms": error.retry_after_ms}
    if isinstance(error, ReleaseJob):
        return {"action": "release", "progress": error.progress}
    if isinstance(error, Stopped):
        return None
    return {"action": "fail", "error": f"{type(error).__name__}: {error}", "retryable": True}


def decide(outcome: Outcome, attempt: Attempt) -> Optional[Dict[str, Any]]:
    """The finish item to send for `attempt`, or None to send nothing.

    A fenced lease (lost, or unreachable for a TTL) sends nothing whatever the
    handler did. A handler that stopped is acknowledged by why it was asked
    to: `fail` (not retryable) for a cancel, `fail` (retryable) for a timeout,
    `release` with its checkpoint at shutdown. A handler that finished anyway
    reports its own outcome (a complete after a cancel still lands as done).
    """
    if attempt.fenced:
        return None
    if outcome is None:
        if attempt.reason == CANCEL_REQUESTED:
            outcome = {"action": "fail", "error": "cancel requested; the handler stopped", "retryable": False}
        elif attempt.reason == TIMEOUT:
            outcome = {"action": "fail", "error": "the attempt passed its timeout_ms", "retryable": True}
        elif attempt.reason == SHUTDOWN:
            outcome = {"action": "release"}
        else:
            outcome = {"action": "fail", "error": "the handler stopped", "retryable": True}
    item = dict(outcome, lease_token=attempt.lease_token)
    if item["action"] == "release" and item.get("progress") is None:
        item.pop("progress", None)
        if attempt.progress is not None:
            item["progress"] = attempt.progress
    return item


def grant_instant(sent: float, arrived: float, lease_ttl_s: float) -> float:
    """When the coordinator granted a lease that a claim sent at `sent` answered at `arrived`."""
    return max(sent, arrived - min(lease_ttl_s / 4, 1.0))
