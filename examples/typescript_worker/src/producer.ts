/**
 * A runlease producer in TypeScript on the `runlease` library: enqueues jobs
 * (one, or a batch of `--count` in one transaction) and, with `--wait`, waits
 * for each to end. Prints one JSON line per job on standard output.
 *
 *     node dist/producer.js --queue emails --payload '{"to": "a@example.com"}' --count 3 --wait
 */

import { parseArgs } from "node:util";
import { Producer, RunleaseError } from "runlease";

const USAGE = `usage: node dist/producer.js [--url URL] [--key KEY] --queue QUEUE [--payload JSON]
                            [--count N] [--wait] [--timeout-ms MS]

  --url URL          the coordinator (default RUNLEASE_URL or http://127.0.0.1:8080)
  --key KEY          a producer API key (default RUNLEASE_KEY)
  --queue QUEUE      the queue to enqueue on
  --payload JSON     each job's payload (default {}); a batch adds "n": 0, 1, ...
  --count N          how many jobs, in one batch (default 1)
  --wait             wait for each job to end, and print it then
  --timeout-ms MS    how long --wait waits per job (default 60000)`;

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      url: { type: "string" },
      key: { type: "string" },
      queue: { type: "string" },
      payload: { type: "string" },
      count: { type: "string" },
      wait: { type: "boolean" },
      "timeout-ms": { type: "string" },
    },
  });
  const count = Number(values.count ?? 1);
  if (!values.queue || !Number.isInteger(count) || count < 1 || count > 1000) {
    process.stderr.write(`${USAGE}\n`);
    return 2;
  }
  const payload: unknown = JSON.parse(values.payload ?? "{}");
  const key = values.key ?? process.env["RUNLEASE_KEY"];
  const producer = new Producer({ url: values.url ?? process.env["RUNLEASE_URL"] ?? "http://127.0.0.1:8080", ...(key ? { key } : {}) });

  const jobs =
    count === 1
      ? [await producer.enqueue({ queue: values.queue, payload })]
      : await producer.enqueueBatch(
          Array.from({ length: count }, (_, n) => ({ queue: values.queue!, payload: { ...(payload as object), n } })),
        );
  for (const job of jobs) {
    const seen = values.wait ? await producer.waitForResult(job.id, { timeoutMs: Number(values["timeout-ms"] ?? 60_000) }) : job;
    console.log(JSON.stringify({ id: seen.id, state: seen.state, result: seen.result, error: seen.error }));
  }
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e: unknown) => {
    // Refusals are typed: `code` is the coordinator's error code (or `unreachable`).
    const error = e instanceof RunleaseError ? { code: e.code, status: e.status, message: e.message } : { message: String(e) };
    process.stderr.write(JSON.stringify({ msg: "producer failed", ...error }) + "\n");
    process.exit(1);
  },
);
