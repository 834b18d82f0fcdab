#!/usr/bin/env python3
"""A runlease worker in Python on the `runlease` library (sdk/python).

The library keeps the rules of docs/workers.md: long-poll claims up to the
free slots, each handler in a thread, one heartbeat request per interval for
every held lease (with the handler's checkpoint), outcomes sent with the next
claim (`POST /v1/finish`), a lost finish answer repeated, the handler told to
stop (`job.signal`, `job.check()`, `job.sleep()`) when its lease is lost, a
cancel is requested or no heartbeat got through for a whole lease TTL, and a
drain on SIGTERM or SIGINT. This program adds a command line and one JSON log
line per event on standard error.

The handler is a demonstration: it echoes the payload, works
`{"sleep_ms": N}` milliseconds in 100 ms steps (checkpointing
`{"slept_ms": ...}`), and fails on `{"fail": "message", "retryable": false}`.
Replace `handle` with your own; stamp `(job.job_id, job.run_lease)` on side
effects: delivery is at-least-once.

    python3 -m venv .venv && .venv/bin/pip install ./sdk/python    # or: pip install runlease
    .venv/bin/python examples/python_worker.py --url http://127.0.0.1:8080 --queue emails
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
from typing import Any, Dict

from runlease import ApiError, Attempt, JobFailed, Worker


def handle(job: Attempt) -> Dict[str, Any]:
    """The job's result; raising fails the attempt (`JobFailed` chooses whether it is retried)."""
    payload = job.payload if isinstance(job.payload, dict) else {}
    if "fail" in payload:
        raise JobFailed(str(payload["fail"]), retryable=payload.get("retryable", True) is not False)
    slept = 0
    while slept < int(payload.get("sleep_ms", 0)):
        step = min(100, int(payload["sleep_ms"]) - slept)
        job.sleep(step / 1000)  # raises Stopped once the job must stop
        slept += step
        job.checkpoint({"slept_ms": slept})  # rides the next heartbeat
    return {"echo": job.payload}


class JsonLines(logging.Formatter):
    """The library's events (logger `runlease`, fields in `record.runlease`) as one JSON line each."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "runlease", {})
        return json.dumps({"ts": round(record.created, 3), "msg": record.getMessage(), **fields}, default=str)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("RUNLEASE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--key", default=os.environ.get("RUNLEASE_KEY"), help="a worker API key")
    parser.add_argument("--queue", action="append", dest="queues",
                        help="a queue to claim from (repeatable; default RUNLEASE_QUEUES or 'default')")
    parser.add_argument("--worker-id",
                        default=os.environ.get("RUNLEASE_WORKER_ID", f"py-{socket.gethostname()}-{os.getpid()}"))
    parser.add_argument("--concurrency", type=int, default=4, help="jobs held at once")
    parser.add_argument("--wait-ms", type=int, default=10_000, help="claim long-poll (0..60000)")
    parser.add_argument("--grace-ms", type=int, default=10_000,
                        help="on SIGTERM, how long running handlers may go on before they are stopped and released")
    args = parser.parse_args()

    out = logging.StreamHandler(sys.stderr)
    out.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[out])

    queues = [q.strip() for q in args.queues or os.environ.get("RUNLEASE_QUEUES", "default").split(",") if q.strip()]
    worker = Worker(args.url, queues, handle, key=args.key, worker_id=args.worker_id,
                    concurrency=max(1, args.concurrency), wait_ms=args.wait_ms, grace=args.grace_ms / 1000)
    try:
        worker.run(handle_signals=True)  # SIGTERM/SIGINT: drain, then return
    except ApiError as e:
        # A claim refused for good (a wrong key, role or queue).
        logging.getLogger("runlease").error("claim refused", extra={"runlease": {"status": e.status, "code": e.code}})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
