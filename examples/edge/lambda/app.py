"""A runlease endpoint as an AWS Lambda function URL (Python 3.12).

The coordinator POSTs each job of the queue to the function URL, signed as
Standard Webhooks define it. The handler verifies the signature on the raw
body, answers a short job with its result (200 completes it), and hands a
long one off: it invokes itself asynchronously with the push and answers 202
at once; that invocation heartbeats and completes the job through /v1/*
with the lease token of the push.

    pip install -r requirements.txt -t package && cp app.py package/
    (zip package/, create the function with handler app.handler, a timeout
    above the endpoint's timeout_ms, an asynchronous retry count of 0 and
    permission to invoke itself; add a function URL, auth type NONE: the
    signature is the authentication)
    runlease queues set-endpoint reports https://<id>.lambda-url.<region>.on.aws/
"""

import base64
import json
import os
import time
import urllib.error
import urllib.request

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

WEBHOOK = Webhook(os.environ["RUNLEASE_ENDPOINT_SECRET"])
KEY = os.environ.get("RUNLEASE_KEY")  # a worker key for /v1/*; unset in open mode


def answer(status, body=None, headers=None):
    """A function URL response; a dict or list body is sent as JSON."""
    text = body if isinstance(body, str) or body is None else json.dumps(body)
    kind = "text/plain" if isinstance(body, str) else "application/json"
    return {"statusCode": status, "headers": {"content-type": kind, **(headers or {})}, "body": text or ""}


def handler(event, context):
    if "runlease_push" in event:  # the asynchronous invocation of a long job
        report(event["runlease_push"])
        return None
    body = event.get("body") or ""
    raw = base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()
    try:
        push = WEBHOOK.verify(raw, event.get("headers") or {})  # the bytes that were signed
    except WebhookVerificationError as e:
        return answer(401, f"signature refused: {e}")
    payload = push["job"]["payload"]
    no_retry = {"runlease-no-retry": "true"}
    if not isinstance(payload, dict):
        return answer(422, "the payload must be an object", no_retry)  # fails for good
    if "pages" not in payload:
        if not isinstance(payload.get("name"), str):
            return answer(422, "payload.name must be a string", no_retry)
        return answer(200, {"greeting": f"hello, {payload['name']}"})  # done, with this result
    if not isinstance(payload["pages"], int) or payload["pages"] < 0:
        return answer(422, "payload.pages must be a whole number", no_retry)
    hand_off(push, context)
    return answer(202)  # the lease belongs to the asynchronous invocation now


def hand_off(push, context):
    """Runs `report(push)` in an asynchronous invocation of this function."""
    import boto3  # in the Lambda runtime; only this path needs it

    boto3.client("lambda").invoke(
        FunctionName=context.invoked_function_arn,
        InvocationType="Event",
        Payload=json.dumps({"runlease_push": push}).encode(),
    )


def call(push, path, body):
    """POSTs `body` to the coordinator; answers (status, JSON body or None)."""
    request = urllib.request.Request(
        push["coordinator_url"].rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **({"authorization": f"Bearer {KEY}"} if KEY else {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None
    except OSError:
        return 0, None


def report(push):
    """The long job: a heartbeat with the page reached after each page, then complete."""
    token, ttl_s = push["lease"]["lease_token"], push["lease"]["lease_ttl_ms"] / 1000
    payload = push["job"]["payload"]
    renewed = time.monotonic()
    for page in range((push["job"].get("progress") or {}).get("page", 0), payload["pages"]):
        time.sleep(payload.get("page_ms", 1000) / 1000)  # one page, well under the TTL
        status, body = call(push, "/v1/heartbeat", {"leases": [{"lease_token": token, "progress": {"page": page + 1}}]})
        state = body["leases"][0]["status"] if status == 200 else "error"
        if state == "lease_lost":
            return  # someone else runs the job now: send nothing
        if state == "cancel_requested":
            call(push, "/v1/release", {"lease_token": token})  # acknowledges the cancel
            return
        if state == "renewed":
            renewed = time.monotonic()
        elif time.monotonic() - renewed > ttl_s:
            return  # cut off for a whole TTL: the lease may be gone
    call(push, "/v1/complete", {"lease_token": token, "result": {"pages": payload["pages"]}})
