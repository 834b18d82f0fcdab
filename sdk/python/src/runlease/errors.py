"""Errors: one exception per way a caller branches.

`ApiError` carries the coordinator's JSON error (`{"error": {"code",
"message"}}`); each stable code has its own subclass, so a caller can catch
`NotFound` or `LeaseLost` rather than compare strings.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class RunleaseError(Exception):
    """The base of every error this library raises."""


class Unreachable(RunleaseError):
    """No answer from the coordinator: refused, reset, timed out, or lost."""


class ApiError(RunleaseError):
    """A non-2xx answer. `code` is the protocol's stable error code."""

    def __init__(self, status: int, code: str, message: str, retry_after: Optional[float] = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        #: Seconds from `Retry-After`, on 429 and 503 answers.
        self.retry_after = retry_after


class BadRequest(ApiError):
    """400 `bad_request`: not JSON, a bad path or query, a malformed lease token."""


class Invalid(ApiError):
    """422 `invalid`: well-formed JSON of the wrong shape or out of range."""


class Unauthorized(ApiError):
    """401 `unauthorized`: no key, or a key the coordinator does not know."""


class Forbidden(ApiError):
    """403 `forbidden`: the key's role or queue list does not allow this."""


class NotFound(ApiError):
    """404 `not_found`: no such job or schedule (or not visible to this key)."""


class MethodNotAllowed(ApiError):
    """405 `method_not_allowed`."""


class LeaseLost(ApiError):
    """409 `lease_lost`: the lease is stale, foreign or forged; drop the job."""


class Conflict(ApiError):
    """409 `conflict`: the job's state does not allow this."""


class TooLarge(ApiError):
    """413 `too_large`: the body is over the coordinator's limit."""


class Overloaded(ApiError):
    """429/503 `overloaded`: try again after `retry_after` seconds."""


class Internal(ApiError):
    """500 `internal`: a fault on the coordinator's side."""


_BY_CODE: Dict[str, Type[ApiError]] = {
    "bad_request": BadRequest,
    "invalid": Invalid,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "lease_lost": LeaseLost,
    "conflict": Conflict,
    "too_large": TooLarge,
    "overloaded": Overloaded,
    "internal": Internal,
}


def api_error(status: int, body: bytes, retry_after: Optional[str]) -> ApiError:
    """The exception for a non-2xx answer, from its body and `Retry-After`."""
    code, message = "http_%d" % status, body[:200].decode("utf-8", "replace")
    try:
        import json

        parsed: Any = json.loads(body)
        code, message = str(parsed["error"]["code"]), str(parsed["error"]["message"])
    except (ValueError, KeyError, TypeError):
        pass
    seconds: Optional[float] = None
    if retry_after:
        try:
            seconds = float(retry_after)
        except ValueError:
            seconds = None
    return _BY_CODE.get(code, ApiError)(status, code, message, seconds)


class JobFailed(Exception):
    """Raise from a handler to fail the attempt with `message`.

    `retryable=False` fails the job at once; `retry_after_ms` overrides the
    coordinator's backoff before the next attempt.
    """

    def __init__(self, message: str, *, retryable: bool = True, retry_after_ms: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.retry_after_ms = retry_after_ms


class RetryLater(Exception):
    """Raise from a handler when the work cannot be done now.

    A pull worker fails the attempt as retryable with `retry_after_ms`; a push
    handler answers 503 with `Retry-After`, which the coordinator takes as a
    release that charges no attempt.
    """

    def __init__(self, retry_after_ms: int) -> None:
        super().__init__(f"retry after {retry_after_ms} ms")
        self.retry_after_ms = retry_after_ms


class ReleaseJob(Exception):
    """Raise from a handler to give the lease back without charging an attempt.

    `progress` becomes the checkpoint the next attempt receives.
    """

    def __init__(self, progress: Any = None) -> None:
        super().__init__("release")
        self.progress = progress


class Stopped(Exception):
    """Raised by `Attempt.check` and `Attempt.sleep` once the handler must stop."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SignatureError(RunleaseError):
    """A push request whose Standard Webhooks signature or timestamp does not verify."""
