"""The library beyond the conformance scenarios: the producers' calls and typed
errors against a live coordinator, and the push handler through each of its
adapters (ASGI, WSGI, Lambda function URL) with requests signed by the
independent `standardwebhooks` library."""

from __future__ import annotations

import asyncio
import base64
import datetime
import io
import json
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest
from standardwebhooks.webhooks import Webhook

from runlease import (
    AsyncProducer,
    Attempt,
    Conflict,
    Invalid,
    JobFailed,
    NotFound,
    Producer,
    PushHandler,
    Unreachable,
    Worker,
)

MISSING_ID = "0197a3c2-5b1e-7c3a-9f2e-3b8d1c0a4e51"


def test_producer_enqueues_reads_waits_and_raises_typed_errors(url: str, key: Optional[str], queue: str) -> None:
    with Producer(url, key) as producer:
        one = producer.enqueue(queue, {"n": 1}, idempotency_key="k1")
        assert (one.queue, one.state, one.payload, one.attempt, one.run_lease) == (queue, "queued", {"n": 1}, 0, 0)
        again = producer.enqueue(queue, {"n": 99}, idempotency_key="k1")
        assert again.id == one.id and again.payload == {"n": 1}, "a repeated idempotency key answers the original job"
        batch = producer.enqueue_batch([{"queue": queue, "payload": {"n": 2}},
                                        {"queue": queue, "payload": {"n": 3}, "priority": -1}])
        assert [j.payload for j in batch] == [{"n": 2}, {"n": 3}]
        read = producer.get(batch[1].id)
        assert (read.id, read.raw["priority"], read.attempts) == (batch[1].id, -1, [])

        with pytest.raises(NotFound) as missing:
            producer.get(MISSING_ID)
        assert (missing.value.status, missing.value.code) == (404, "not_found")
        with pytest.raises(Invalid) as invalid:
            producer.enqueue("no spaces allowed", 1)
        assert (invalid.value.status, invalid.value.code) == (422, "invalid")
        with pytest.raises(Unreachable):
            Producer("http://127.0.0.1:9").get(one.id)

        def double(job: Attempt) -> Dict[str, int]:
            if job.payload["n"] == 3:
                raise JobFailed("three is refused", retryable=False)
            return {"doubled": job.payload["n"] * 2}

        worker = Worker(url, [queue], double, key=key, concurrency=3, wait_ms=500)
        thread = threading.Thread(target=worker.run)
        thread.start()
        try:
            done = producer.wait(batch[0].id, timeout=15)
            failed = producer.wait(batch[1].id, timeout=15)
        finally:
            worker.stop()
            thread.join(timeout=30)
        assert not thread.is_alive(), "the worker drained"
        assert (done.state, done.result) == ("done", {"doubled": 4})
        assert failed.state == "failed" and "three is refused" in (failed.error or "")
        assert [a["outcome"] for a in failed.attempts] == ["failed"]
        with pytest.raises(Conflict) as conflict:
            producer.cancel(done.id)
        assert conflict.value.status == 409


def test_async_producer_enqueues_waits_and_cancels(url: str, key: Optional[str], queue: str) -> None:
    async def main() -> None:
        async with AsyncProducer(url, key) as producer:
            job = await producer.enqueue(queue, {"a": 1}, delay_ms=60_000)
            assert job.state == "queued"
            cancelled = await producer.cancel(job.id)
            assert cancelled.state == "cancelled"
            waited = await producer.wait(job.id, timeout=5)
            assert (waited.id, waited.state) == (job.id, "cancelled")
            with pytest.raises(NotFound):
                await producer.get(MISSING_ID)

    asyncio.run(main())


# ---- the push handler's adapters ----

SECRET = "whsec_" + base64.b64encode(b"runlease-python-adapter-tests-32").decode()


def signed(payload: Any, secret: str = SECRET) -> Tuple[bytes, Dict[str, str]]:
    """A push body for a made-up lease, and its headers, signed by `standardwebhooks`."""
    body = json.dumps({
        "job": {"id": MISSING_ID, "queue": "q", "payload": payload, "attempt": 1, "max_attempts": 4, "progress": None},
        "lease": {"lease_token": "rl2.x", "run_lease": 1, "lease_ttl_ms": 15000, "heartbeat_interval_ms": 5000},
        "coordinator_url": "http://127.0.0.1:9",
    })
    at = datetime.datetime.now(tz=datetime.timezone.utc)
    msg_id = f"{MISSING_ID}:1"
    return body.encode(), {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, at, body),
    }


def echo(job: Attempt) -> Dict[str, Any]:
    if job.payload == "bad":
        raise JobFailed("bad input", retryable=False)
    return {"echo": job.payload, "run_lease": job.run_lease}


FORGED = "whsec_" + base64.b64encode(os.urandom(32)).decode()


def asgi_call(push: PushHandler, method: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, Dict[str, str], bytes]:
    sent: List[Dict[str, Any]] = []

    async def main() -> None:
        chunks = [body[:10], body[10:]]

        async def receive() -> Dict[str, Any]:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

        async def send(message: Dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": "/",
                 "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}
        await push.asgi(scope, receive, send)

    asyncio.run(main())
    start, content = sent
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, content["body"]


def wsgi_call(push: PushHandler, method: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, Dict[str, str], bytes]:
    environ: Dict[str, Any] = {"REQUEST_METHOD": method, "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
    for k, v in headers.items():
        if k == "content-type":
            environ["CONTENT_TYPE"] = v
        else:
            environ["HTTP_" + k.upper().replace("-", "_")] = v
    started: List[Any] = []
    out = b"".join(push.wsgi(environ, lambda status, hdrs: started.append((status, hdrs))))
    status, hdrs = started[0]
    return int(status.split()[0]), dict(hdrs), out


def lambda_call(push: PushHandler, method: str, body: bytes, headers: Dict[str, str]) -> Tuple[int, Dict[str, str], bytes]:
    event = {"version": "2.0", "headers": headers, "isBase64Encoded": True,
             "body": base64.b64encode(body).decode(),
             "requestContext": {"http": {"method": method, "path": "/"}}}
    answer = push.lambda_handler(event, None)
    return answer["statusCode"], answer["headers"], answer["body"].encode()


@pytest.mark.parametrize("call", [asgi_call, wsgi_call, lambda_call], ids=["asgi", "wsgi", "lambda"])
def test_push_adapters_answer_as_the_endpoint_table_says(call: Any) -> None:
    push = PushHandler([SECRET], echo)
    body, headers = signed({"a": 1})
    status, _, out = call(push, "POST", body, headers)
    assert (status, json.loads(out)) == (200, {"echo": {"a": 1}, "run_lease": 1})

    body, headers = signed("bad")
    status, hdrs, out = call(push, "POST", body, headers)
    assert status == 500 and hdrs.get("runlease-no-retry") == "true"
    assert "bad input" in json.loads(out)["error"]["message"]

    body, headers = signed({"a": 1}, FORGED)
    status, _, out = call(push, "POST", body, headers)
    assert status == 401 and json.loads(out)["error"]["code"] == "unauthorized"

    body, headers = signed({"a": 1})
    status, _, _ = call(push, "POST", body.replace(b'"a"', b'"b"'), headers)
    assert status == 401, "a body changed after signing is refused"

    status, _, _ = call(push, "GET", b"", {})
    assert status == 405
