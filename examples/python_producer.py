#!/usr/bin/env python3
"""A runlease producer in Python on the `runlease` library (sdk/python).

Enqueues jobs (one, or a batch of `--count` in one transaction) and, with
`--wait`, waits for each to end (long-polls). Prints one JSON line per job on
standard output; a refusal exits 1 with the coordinator's error code.

    python3 examples/python_producer.py --queue emails --payload '{"to": "a@example.com"}' --count 3 --wait
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from runlease import ApiError, Producer, Unreachable


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default=os.environ.get("RUNLEASE_URL", "http://127.0.0.1:8080"))
    parser.add_argument("--key", default=os.environ.get("RUNLEASE_KEY"), help="a producer API key")
    parser.add_argument("--queue", required=True)
    parser.add_argument("--payload", type=json.loads, default={}, help="each job's payload, JSON")
    parser.add_argument("--count", type=int, default=1, help='a batch of N, each payload with "n" added')
    parser.add_argument("--wait", action="store_true", help="wait for each job to end")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds --wait waits per job")
    args = parser.parse_args()

    try:
        with Producer(args.url, args.key) as producer:
            if args.count == 1:
                jobs = [producer.enqueue(args.queue, args.payload)]
            else:
                base = args.payload if isinstance(args.payload, dict) else {}
                jobs = producer.enqueue_batch(
                    [{"queue": args.queue, "payload": {**base, "n": n}} for n in range(args.count)])
            for job in jobs:
                seen = producer.wait(job.id, timeout=args.timeout) if args.wait else job
                print(json.dumps({"id": seen.id, "state": seen.state, "result": seen.result, "error": seen.error}))
    except ApiError as e:
        print(json.dumps({"msg": "producer refused", "code": e.code, "status": e.status, "message": e.message}),
              file=sys.stderr)
        return 1
    except Unreachable as e:
        print(json.dumps({"msg": "coordinator unreachable", "error": str(e)}), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
