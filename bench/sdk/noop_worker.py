"""A no-op pull worker on the Python library (sdk/python, installed), for
`runlease-bench sdk`: python noop_worker.py URL QUEUE CONCURRENCY sync|asyncio.
Runs until SIGTERM, then drains."""

import asyncio
import signal
import sys

from runlease import AsyncWorker, Worker


def noop(_job: object) -> None:
    return None


async def anoop(_job: object) -> None:
    return None


def main() -> None:
    url, queue, concurrency, mode = sys.argv[1:5]
    if mode == "sync":
        Worker(url, [queue], noop, concurrency=int(concurrency), wait_ms=1000).run(handle_signals=True)
        return

    async def run() -> None:
        worker = AsyncWorker(url, [queue], anoop, concurrency=int(concurrency), wait_ms=1000)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        await worker.run()

    asyncio.run(run())


if __name__ == "__main__":
    main()
