"""runlease: workers and producers for a runlease coordinator, blocking and asyncio.

- `Worker` / `AsyncWorker`: the pull worker (claim loop, heartbeats,
  finish-and-claim, self-fencing, drain).
- `PushHandler`: the handler of an endpoint-served queue, with ASGI, WSGI and
  Lambda function URL adapters.
- `Producer` / `AsyncProducer`: enqueue, batch, read, wait for a result, cancel.
"""

from ._http import __version__
from .aio import AsyncWorker
from .attempt import Attempt
from .errors import (
    ApiError,
    BadRequest,
    Conflict,
    Forbidden,
    Internal,
    Invalid,
    JobFailed,
    LeaseLost,
    MethodNotAllowed,
    NotFound,
    Overloaded,
    ReleaseJob,
    RetryLater,
    RunleaseError,
    SignatureError,
    Stopped,
    TooLarge,
    Unauthorized,
    Unreachable,
)
from .producer import AsyncProducer, Job, Producer
from .push import PushHandler, PushResponse, verify
from .worker import Worker

__all__ = [
    "__version__", "ApiError", "AsyncProducer", "AsyncWorker", "Attempt", "BadRequest", "Conflict", "Forbidden",
    "Internal", "Invalid", "Job", "JobFailed", "LeaseLost", "MethodNotAllowed", "NotFound", "Overloaded",
    "Producer", "PushHandler", "PushResponse", "ReleaseJob", "RetryLater", "RunleaseError", "SignatureError",
    "Stopped", "TooLarge", "Unauthorized", "Unreachable", "Worker", "verify",
]
