"""A runlease endpoint as an AWS Lambda function URL, on the runlease library.

    pip install runlease -t package/ && cp lambda_function.py package/
    (deploy package/ with the handler lambda_function.handler, a function URL,
     and RUNLEASE_ENDPOINT_SECRET from `runlease queues endpoint-secret reports`)
    runlease queues set-endpoint reports https://<id>.lambda-url.<region>.on.aws/

`{name}` is a short job, answered with its result; `{pages, page_ms}` a long
one, a page at a time with a checkpoint each. A Lambda is frozen once it
answers, so work past RUNLEASE_HANDOFF_AFTER seconds is heartbeated and
finished through /v1/* before the function answers 202: give the queue an
endpoint timeout_ms longer than the longest job. `app` is the same handler
for an ASGI server (`uvicorn lambda_function:app`), where a 202 comes at once.
"""

import os

from runlease import Attempt, JobFailed, PushHandler


def run(job: Attempt) -> object:
    p = job.payload
    if isinstance(p.get("fail"), str):
        raise RuntimeError(p["fail"])  # retried while attempts last
    if "pages" not in p:
        if not isinstance(p.get("name"), str):
            raise JobFailed("payload.name must be a string", retryable=False)  # fails at once
        return {"greeting": f"hello, {p['name']}"}
    pages, page_ms = p["pages"], p.get("page_ms", 1000)
    for page in range((job.progress or {}).get("page", 0), pages):
        job.sleep(page_ms / 1000)  # render one page; raises on a cancel or a lost lease
        job.checkpoint({"page": page + 1})
    return {"pages": pages}


push = PushHandler(
    os.environ["RUNLEASE_ENDPOINT_SECRET"].split(),
    run,
    key=os.environ.get("RUNLEASE_KEY"),
    handoff_after=float(os.environ.get("RUNLEASE_HANDOFF_AFTER", "1")),
)
handler = push.lambda_handler
app = push.asgi
