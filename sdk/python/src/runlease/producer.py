"""The producer: enqueue jobs, read them, wait for their result, cancel them."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

import httpx

from ._http import AsyncApi, SyncApi

#: States a job does not leave by itself.
TERMINAL_STATES = frozenset({"done", "failed", "cancelled"})

#: The longest long-poll one `GET /v1/jobs/{id}?wait_ms=` may ask for.
MAX_WAIT_MS = 60_000


@dataclass(frozen=True)
class Job:
    """A job as the coordinator answers it. `raw` holds every field of the answer."""

    id: str
    queue: str
    state: str
    payload: Any
    attempt: int
    max_attempts: int
    run_lease: int
    progress: Any
    result: Any
    error: Optional[str]
    cancel_requested: bool
    attempts: List[Dict[str, Any]] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict)

    @property
    def is_terminal(self) -> bool:
        """Whether the job is `done`, `failed` or `cancelled`."""
        return self.state in TERMINAL_STATES

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "Job":
        """Reads a job object of the protocol."""
        return cls(
            id=str(raw["id"]),
            queue=str(raw["queue"]),
            state=str(raw["state"]),
            payload=raw.get("payload"),
            attempt=int(raw.get("attempt", 0)),
            max_attempts=int(raw.get("max_attempts", 0)),
            run_lease=int(raw.get("run_lease", 0)),
            progress=raw.get("progress"),
            result=raw.get("result"),
            error=raw.get("error"),
            cancel_requested=bool(raw.get("cancel_requested", False)),
            attempts=list(raw.get("attempts") or []),
            raw=dict(raw),
        )


def enqueue_body(queue: str, payload: Any, options: Mapping[str, Any]) -> Dict[str, Any]:
    """The body of one enqueue: `queue`, `payload`, and the options that are set."""
    body: Dict[str, Any] = {"queue": queue, "payload": payload}
    body.update({k: v for k, v in options.items() if v is not None})
    return body


class Producer:
    """Blocking producer calls. `key` is a producer (or admin) key, if the coordinator has keys.

    Every method raises an `ApiError` subclass for a refusal (its `code` is the
    protocol's) and `Unreachable` when no answer came.
    """

    def __init__(self, url: str, key: Optional[str] = None, *, http: Optional[httpx.Client] = None) -> None:
        self._api = SyncApi(url, key, http)

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: Optional[int] = None,
        delay_ms: Optional[int] = None,
        run_at: Optional[str] = None,
        max_attempts: Optional[int] = None,
        timeout_ms: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        concurrency_key: Optional[str] = None,
        traceparent: Optional[str] = None,
    ) -> Job:
        """`POST /v1/jobs`: one job (the original one for a repeated `idempotency_key`)."""
        options = dict(priority=priority, delay_ms=delay_ms, run_at=run_at, max_attempts=max_attempts,
                       timeout_ms=timeout_ms, idempotency_key=idempotency_key, concurrency_key=concurrency_key)
        headers = {"traceparent": traceparent} if traceparent else None
        return Job.from_json(self._api.call("POST", "/v1/jobs", enqueue_body(queue, payload, options), headers=headers))

    def enqueue_batch(self, jobs: Sequence[Mapping[str, Any]]) -> List[Job]:
        """`POST /v1/jobs/batch`: 1 to 1000 enqueue bodies in one transaction, answered in order."""
        answer = self._api.call("POST", "/v1/jobs/batch", {"jobs": [dict(j) for j in jobs]})
        return [Job.from_json(j) for j in answer["jobs"]]

    def get(self, job_id: str, *, wait_ms: int = 0) -> Job:
        """`GET /v1/jobs/{id}`; with `wait_ms`, parks until the job is terminal or the time passed."""
        params = {"wait_ms": str(wait_ms)} if wait_ms else None
        return Job.from_json(self._api.call("GET", f"/v1/jobs/{job_id}", params=params,
                                            timeout=wait_ms / 1000 + 30))

    def wait(self, job_id: str, *, timeout: float = 60.0) -> Job:
        """Waits until the job is terminal (long-polls), or `timeout` seconds passed; answers it as it is."""
        end = time.monotonic() + timeout
        while True:
            left_ms = int((end - time.monotonic()) * 1000)
            job = self.get(job_id, wait_ms=max(0, min(left_ms, MAX_WAIT_MS)))
            if job.is_terminal or left_ms <= 0:
                return job

    def cancel(self, job_id: str) -> Job:
        """`POST /v1/jobs/{id}/cancel`: the job after the cancel."""
        return Job.from_json(self._api.call("POST", f"/v1/jobs/{job_id}/cancel"))

    def close(self) -> None:
        """Closes the HTTP client (unless it was given)."""
        self._api.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class AsyncProducer:
    """The asyncio form of `Producer`: the same methods, awaited."""

    def __init__(self, url: str, key: Optional[str] = None, *, http: Optional[httpx.AsyncClient] = None) -> None:
        self._api = AsyncApi(url, key, http)

    async def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: Optional[int] = None,
        delay_ms: Optional[int] = None,
        run_at: Optional[str] = None,
        max_attempts: Optional[int] = None,
        timeout_ms: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        concurrency_key: Optional[str] = None,
        traceparent: Optional[str] = None,
    ) -> Job:
        """`POST /v1/jobs`."""
        options = dict(priority=priority, delay_ms=delay_ms, run_at=run_at, max_attempts=max_attempts,
                       timeout_ms=timeout_ms, idempotency_key=idempotency_key, concurrency_key=concurrency_key)
        headers = {"traceparent": traceparent} if traceparent else None
        body = enqueue_body(queue, payload, options)
        return Job.from_json(await self._api.call("POST", "/v1/jobs", body, headers=headers))

    async def enqueue_batch(self, jobs: Sequence[Mapping[str, Any]]) -> List[Job]:
        """`POST /v1/jobs/batch`."""
        answer = await self._api.call("POST", "/v1/jobs/batch", {"jobs": [dict(j) for j in jobs]})
        return [Job.from_json(j) for j in answer["jobs"]]

    async def get(self, job_id: str, *, wait_ms: int = 0) -> Job:
        """`GET /v1/jobs/{id}[?wait_ms=]`."""
        params = {"wait_ms": str(wait_ms)} if wait_ms else None
        return Job.from_json(await self._api.call("GET", f"/v1/jobs/{job_id}", params=params,
                                                  timeout=wait_ms / 1000 + 30))

    async def wait(self, job_id: str, *, timeout: float = 60.0) -> Job:
        """Waits until the job is terminal, or `timeout` seconds passed."""
        end = time.monotonic() + timeout
        while True:
            left_ms = int((end - time.monotonic()) * 1000)
            job = await self.get(job_id, wait_ms=max(0, min(left_ms, MAX_WAIT_MS)))
            if job.is_terminal or left_ms <= 0:
                return job

    async def cancel(self, job_id: str) -> Job:
        """`POST /v1/jobs/{id}/cancel`."""
        return Job.from_json(await self._api.call("POST", f"/v1/jobs/{job_id}/cancel"))

    async def close(self) -> None:
        """Closes the HTTP client (unless it was given)."""
        await self._api.close()

    async def __aenter__(self) -> "AsyncProducer":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
