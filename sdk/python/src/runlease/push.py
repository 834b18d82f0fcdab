"""The push handler for endpoint-served queues, with ASGI, WSGI and Lambda adapters.

The coordinator POSTs each job of an endpoint-served queue, signed as
Standard Webhooks define it. `PushHandler` verifies the signature on the raw
body, refuses a timestamp more than `tolerance_s` away, runs the handler and
answers as the endpoint table of the protocol says:

| the handler | the answer | the coordinator then |
| --- | --- | --- |
| returns a value | 200 with it as JSON | completes the job with it |
| raises `JobFailed(retryable=False)` | 500, `runlease-no-retry: true` | fails it, not retryable |
| raises `JobFailed` or anything else | 500 | fails it (retry budget, backoff) |
| raises `RetryLater(ms)` | 503, `Retry-After` | releases it, no attempt charged |
| is still running after `handoff_after` s | 202 | leaves the lease to this process |

After a 202 the handler goes on in the background (a thread, or an asyncio
task) and its lease is kept here: heartbeats and the outcome go to the
coordinator's `/v1/*` with the body's `lease.lease_token`, exactly as a pull
worker's would.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import hmac
import inspect
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import httpx

from ._http import AsyncApi, SyncApi
from .attempt import (
    CANCEL_REQUESTED,
    LEASE_LOST,
    MAX_BACKOFF_S,
    UNREACHABLE,
    Attempt,
    Outcome,
    decide,
    event,
    outcome_of_exception,
    outcome_of_result,
)
from .errors import ApiError, JobFailed, RetryLater, SignatureError, Unreachable

#: How far a push's `webhook-timestamp` may be from this clock, in seconds.
DEFAULT_TOLERANCE_S = 300

#: How much of an error message an answer carries.
MAX_ERROR_BYTES = 1000


def _keys(secrets: Iterable[str]) -> List[bytes]:
    keys = []
    for secret in secrets:
        raw = secret[len("whsec_"):] if secret.startswith("whsec_") else secret
        keys.append(base64.b64decode(raw))
    if not keys:
        raise ValueError("a push handler needs at least one endpoint secret")
    return keys


def verify(
    keys: Sequence[bytes],
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: Optional[float] = None,
) -> None:
    """Checks a Standard Webhooks signature; raises `SignatureError` saying what is wrong.

    `headers` has lower-case names. Any `v1,` signature of the header made with
    any of `keys` (old and new during a rotation) is enough.
    """
    msg_id = headers.get("webhook-id")
    stamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not stamp or not signatures:
        raise SignatureError("missing webhook-id, webhook-timestamp or webhook-signature header")
    try:
        sent = int(stamp)
    except ValueError:
        raise SignatureError("the webhook-timestamp header is not unix seconds") from None
    current = time.time() if now is None else now
    if abs(current - sent) > tolerance_s:
        raise SignatureError(f"the webhook-timestamp is more than {tolerance_s:.0f} s from now")
    signed = msg_id.encode() + b"." + stamp.encode() + b"." + body
    expected = [base64.b64encode(hmac.new(k, signed, hashlib.sha256).digest()) for k in keys]
    for sig in signatures.split():
        version, _, value = sig.partition(",")
        if version != "v1":
            continue
        given = value.encode()
        if any(hmac.compare_digest(given, e) for e in expected):
            return
    raise SignatureError("no signature of the webhook-signature header verifies")


@dataclass
class PushResponse:
    """An answer to the coordinator: status, headers (lower-case names), body bytes."""

    status: int
    headers: Dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def _json(status: int, value: Any, headers: Optional[Dict[str, str]] = None) -> PushResponse:
    all_headers = {"content-type": "application/json"}
    all_headers.update(headers or {})
    return PushResponse(status, all_headers, json.dumps(value).encode())


def _error(status: int, code: str, message: str, headers: Optional[Dict[str, str]] = None) -> PushResponse:
    cut = message.encode()[:MAX_ERROR_BYTES].decode("utf-8", "ignore")
    return _json(status, {"error": {"code": code, "message": cut}}, headers)


def _answer(outcome: Outcome, error: Optional[BaseException]) -> PushResponse:
    """The endpoint table: the answer for what the handler did."""
    if isinstance(error, RetryLater):
        seconds = max(1, -(-error.retry_after_ms // 1000))
        return _error(503, "retry_later", str(error), {"retry-after": str(seconds)})
    if outcome is not None and outcome["action"] == "complete":
        return _json(200, outcome.get("result"))
    if isinstance(error, JobFailed):
        headers = {} if error.retryable else {"runlease-no-retry": "true"}
        return _error(500, "job_failed", error.message, headers)
    if outcome is not None and outcome["action"] == "release":
        return _error(503, "released", "the handler gave the job back", {"retry-after": "1"})
    text = "the handler stopped" if error is None else f"{type(error).__name__}: {error}"
    return _error(500, "job_failed", text)


@dataclass
class _Push:
    """A verified push: the lease as a claim would answer it, and where to send heartbeats."""

    lease: Dict[str, Any]
    coordinator_url: str


def _parse(body: bytes, headers: Mapping[str, str]) -> _Push:
    doc = json.loads(body)
    job, lease = doc["job"], doc["lease"]
    if headers.get("webhook-id") != f"{job['id']}:{lease['run_lease']}":
        raise SignatureError("the webhook-id does not name the body's job and run lease")
    return _Push(
        lease={
            "job_id": job["id"],
            "run_lease": lease["run_lease"],
            "lease_token": lease["lease_token"],
            "queue": job.get("queue", ""),
            "payload": job.get("payload"),
            "attempt": job.get("attempt", 1),
            "progress": job.get("progress"),
            "traceparent": job.get("traceparent"),
            "dependencies": job.get("dependencies"),
            "lease_ttl_ms": lease["lease_ttl_ms"],
            "heartbeat_interval_ms": lease["heartbeat_interval_ms"],
        },
        coordinator_url=str(doc["coordinator_url"]),
    )


Handler = Callable[[Attempt], Union[Awaitable[Any], Any]]


class PushHandler:
    """Serves one endpoint-served queue. `handler(attempt)` is a blocking or an async function.

    `secrets` are the queue's endpoint secrets (`whsec_...`; give old and new
    during a rotation). `key` is a worker key for the `/v1/*` calls of a
    hand-off. `handoff_after` (seconds; None: never) is how long a request
    waits for the handler before answering 202 and carrying on in the
    background. `on_background` is told of each background task (asyncio) or
    thread future (blocking) so a server can wait for them at shutdown.
    """

    def __init__(
        self,
        secrets: Union[str, Sequence[str]],
        handler: Handler,
        *,
        key: Optional[str] = None,
        handoff_after: Optional[float] = None,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        coordinator_url: Optional[str] = None,
    ) -> None:
        self._keys = _keys([secrets] if isinstance(secrets, str) else secrets)
        self.handler = handler
        self.key = key
        self.handoff_after = handoff_after
        self.tolerance_s = tolerance_s
        self.coordinator_url = coordinator_url
        #: Work handed off and not yet finished (futures of threads, or asyncio tasks).
        self.background: List[Union["concurrent.futures.Future[None]", "asyncio.Task[None]"]] = []
        self._pool = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="runlease-push")

    def _verified(self, body: bytes, headers: Mapping[str, str]) -> Union[_Push, PushResponse]:
        lower = {k.lower(): v for k, v in headers.items()}
        try:
            verify(self._keys, lower, body, tolerance_s=self.tolerance_s)
        except SignatureError as e:
            return _error(401, "unauthorized", str(e))
        try:
            return _parse(body, lower)
        except SignatureError as e:
            return _error(401, "unauthorized", str(e))
        except (ValueError, KeyError, TypeError) as e:
            return _error(400, "bad_request", f"not a runlease push body: {e}")

    # ---- blocking ----

    def handle(self, body: bytes, headers: Mapping[str, str]) -> PushResponse:
        """Answers one push (blocking); a blocking handler runs in a thread of the handler's pool."""
        push = self._verified(body, headers)
        if isinstance(push, PushResponse):
            return push
        attempt = Attempt(push.lease)
        future = self._pool.submit(self._call_blocking, attempt)
        try:
            outcome, error = future.result(timeout=self.handoff_after)
        except concurrent.futures.TimeoutError:
            url = self.coordinator_url or push.coordinator_url
            self.background.append(self._pool.submit(_keep_blocking, SyncApi(url, self.key), attempt, future))
            return PushResponse(202)
        return _answer(outcome, error)

    def _call_blocking(self, attempt: Attempt) -> Tuple[Outcome, Optional[BaseException]]:
        try:
            value = self.handler(attempt)
            if inspect.isawaitable(value):
                value = asyncio.run(_awaited(value))
            return outcome_of_result(value), None
        except Exception as e:  # noqa: BLE001 - the answer reports any handler error
            return outcome_of_exception(e), e

    # ---- asyncio ----

    async def handle_async(self, body: bytes, headers: Mapping[str, str]) -> PushResponse:
        """Answers one push (asyncio); an async handler runs as a task, a blocking one in a thread."""
        push = self._verified(body, headers)
        if isinstance(push, PushResponse):
            return push
        attempt = Attempt(push.lease)
        task = asyncio.ensure_future(self._call_async(attempt))
        done, _ = await asyncio.wait({task}, timeout=self.handoff_after)
        if not done:
            url = self.coordinator_url or push.coordinator_url
            self.background.append(asyncio.ensure_future(_keep_async(AsyncApi(url, self.key), attempt, task)))
            return PushResponse(202)
        outcome, error = task.result()
        return _answer(outcome, error)

    async def _call_async(self, attempt: Attempt) -> Tuple[Outcome, Optional[BaseException]]:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            def cancel(_reason: str) -> None:
                loop.call_soon_threadsafe(task.cancel)

            attempt.on_stop(cancel)
        try:
            if inspect.iscoroutinefunction(self.handler):
                value = await self.handler(attempt)
            else:
                value = await loop.run_in_executor(self._pool, self.handler, attempt)
                if inspect.isawaitable(value):
                    value = await value
            return outcome_of_result(value), None
        except asyncio.CancelledError:
            if attempt.reason is None:
                raise
            return None, None
        except Exception as e:  # noqa: BLE001
            return outcome_of_exception(e), e

    async def wait_background(self) -> None:
        """Waits until every handed-off job has sent its outcome (asyncio)."""
        pending = [t for t in self.background if isinstance(t, asyncio.Task)]
        await asyncio.gather(*pending, return_exceptions=True)

    def wait_background_blocking(self, timeout: Optional[float] = None) -> None:
        """Waits until every handed-off job has sent its outcome (blocking)."""
        futures = [f for f in self.background if isinstance(f, concurrent.futures.Future)]
        concurrent.futures.wait(futures, timeout=timeout)

    # ---- adapters ----

    async def asgi(self, scope: Dict[str, Any], receive: Callable[[], Awaitable[Dict[str, Any]]],
                   send: Callable[[Dict[str, Any]], Awaitable[None]]) -> None:
        """An ASGI 3 application (Starlette, FastAPI mounts, uvicorn, hypercorn)."""
        if scope["type"] != "http":
            return
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        if scope.get("method") != "POST":
            response = _error(405, "method_not_allowed", "a push is a POST")
        else:
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
            response = await self.handle_async(b"".join(chunks), headers)
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(k.encode(), v.encode()) for k, v in response.headers.items()]})
        await send({"type": "http.response.body", "body": response.body})

    def wsgi(self, environ: Dict[str, Any], start_response: Callable[..., Any]) -> List[bytes]:
        """A WSGI application (gunicorn, Flask mounts, mod_wsgi)."""
        if environ.get("REQUEST_METHOD") != "POST":
            response = _error(405, "method_not_allowed", "a push is a POST")
        else:
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            headers = {k[5:].replace("_", "-").lower(): str(v) for k, v in environ.items() if k.startswith("HTTP_")}
            if "CONTENT_TYPE" in environ:
                headers["content-type"] = str(environ["CONTENT_TYPE"])
            response = self.handle(body, headers)
        reason = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 405: "Method Not Allowed",
                  500: "Internal Server Error", 503: "Service Unavailable"}.get(response.status, "")
        start_response(f"{response.status} {reason}", list(response.headers.items()))
        return [response.body]

    def lambda_handler(self, event_: Dict[str, Any], _context: Any = None) -> Dict[str, Any]:
        """An AWS Lambda function URL handler (payload format 2.0).

        A Lambda is frozen once it answers, so nothing can carry on after a
        202: give a Lambda a `timeout_ms` its handler fits in, and leave
        `handoff_after` unset.
        """
        body = event_.get("body") or ""
        raw = base64.b64decode(body) if event_.get("isBase64Encoded") else body.encode()
        method = event_.get("requestContext", {}).get("http", {}).get("method", "POST")
        if method != "POST":
            response = _error(405, "method_not_allowed", "a push is a POST")
        else:
            response = self.handle(raw, dict(event_.get("headers") or {}))
            if response.status == 202:
                self.wait_background_blocking()
        return {"statusCode": response.status, "headers": response.headers,
                "body": response.body.decode(), "isBase64Encoded": False}


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


# ---- after a 202: keep the lease, then finish through /v1/* ----

def _heartbeat_answer(attempt: Attempt, answer: Dict[str, Any], sent: float) -> None:
    status = answer["leases"][0]["status"]
    if status in ("renewed", "cancel_requested"):
        attempt.renewed_at = max(attempt.renewed_at, sent)
        attempt.renewals += 1
    if status == "cancel_requested":
        attempt.stop(CANCEL_REQUESTED)
    elif status == "lease_lost":
        attempt.stop(LEASE_LOST)


def _heartbeat_body(attempt: Attempt) -> Tuple[Dict[str, Any], Any]:
    item: Dict[str, Any] = {"lease_token": attempt.lease_token}
    progress = attempt.take_checkpoint()
    if progress is not None:
        item["progress"] = progress
    return {"leases": [item]}, progress


def _keep_blocking(api: SyncApi, attempt: Attempt,
                   future: "concurrent.futures.Future[Tuple[Outcome, Optional[BaseException]]]") -> None:
    """Heartbeats the lease until the handler ends (fencing itself after a TTL unheard), then finishes."""
    # The coordinator's last renewal came before the request: count the fence from one interval earlier.
    attempt.renewed_at = time.monotonic() - attempt.heartbeat_interval_s
    try:
        while not future.done():
            if not attempt.fenced and time.monotonic() - attempt.renewed_at >= attempt.lease_ttl_s:
                attempt.stop(UNREACHABLE)
            if attempt.fenced:
                break
            body, progress = _heartbeat_body(attempt)
            sent = time.monotonic()
            try:
                answer = api.call("POST", "/v1/heartbeat", body, timeout=attempt.lease_ttl_s)
                attempt.checkpoint_sent(progress)
                _heartbeat_answer(attempt, answer, sent)
            except (ApiError, Unreachable) as e:
                event("heartbeat failed", job_id=attempt.job_id, error=str(e))
            wait = attempt.heartbeat_interval_s
            try:
                future.result(timeout=wait)
            except concurrent.futures.TimeoutError:
                pass
        outcome, _ = future.result()
        item = decide(outcome, attempt)
        backoff = 0.2
        while item is not None and not attempt.fenced:
            try:
                answer = api.call("POST", "/v1/finish", {"items": [item]})
                event("handed-off job finished", job_id=attempt.job_id, status=answer["items"][0]["status"])
                return
            except ApiError as e:
                if e.status != 429 and e.status < 500:
                    event("finish refused", job_id=attempt.job_id, error=str(e))
                    return
            except Unreachable:
                pass
            if time.monotonic() - attempt.renewed_at >= attempt.lease_ttl_s:
                attempt.stop(UNREACHABLE)
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
    finally:
        api.close()


async def _keep_async(api: AsyncApi, attempt: Attempt,
                      task: "asyncio.Task[Tuple[Outcome, Optional[BaseException]]]") -> None:
    """The asyncio form of `_keep_blocking`."""
    attempt.renewed_at = time.monotonic() - attempt.heartbeat_interval_s
    try:
        while not task.done():
            if not attempt.fenced and time.monotonic() - attempt.renewed_at >= attempt.lease_ttl_s:
                attempt.stop(UNREACHABLE)
            if attempt.fenced:
                break
            body, progress = _heartbeat_body(attempt)
            sent = time.monotonic()
            try:
                answer = await api.call("POST", "/v1/heartbeat", body, timeout=attempt.lease_ttl_s)
                attempt.checkpoint_sent(progress)
                _heartbeat_answer(attempt, answer, sent)
            except (ApiError, Unreachable) as e:
                event("heartbeat failed", job_id=attempt.job_id, error=str(e))
            await asyncio.wait({task}, timeout=attempt.heartbeat_interval_s)
        outcome, _ = await task
        item = decide(outcome, attempt)
        backoff = 0.2
        while item is not None and not attempt.fenced:
            try:
                answer = await api.call("POST", "/v1/finish", {"items": [item]})
                event("handed-off job finished", job_id=attempt.job_id, status=answer["items"][0]["status"])
                return
            except ApiError as e:
                if e.status != 429 and e.status < 500:
                    event("finish refused", job_id=attempt.job_id, error=str(e))
                    return
            except Unreachable:
                pass
            if time.monotonic() - attempt.renewed_at >= attempt.lease_ttl_s:
                attempt.stop(UNREACHABLE)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
    finally:
        await api.close()
