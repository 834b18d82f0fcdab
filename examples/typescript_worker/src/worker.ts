/**
 * A runlease worker in TypeScript on the `runlease` library (sdk/typescript).
 *
 * The library keeps the rules of docs/workers.md: long-poll claims up to the
 * free slots, one heartbeat request per interval for every held lease (with
 * the handler's checkpoint), outcomes sent with the next claim
 * (`POST /v1/finish`), a lost finish answer repeated, the handler's
 * `job.signal` fired when the lease is lost, a cancel is requested or no
 * heartbeat got through for a whole lease TTL (nothing more is sent for that
 * lease then), and a drain on `stop()`. This program adds a command line,
 * signals and one JSON log line per event.
 *
 * The handler is a demonstration: it echoes the payload, works
 * `{"sleep_ms": N}` milliseconds in 100 ms steps (checkpointing
 * `{"slept_ms": ...}`), and fails on `{"fail": "message", "retryable": false}`.
 * Replace `handle` with your own; stamp `(job.id, job.runLease)` on side
 * effects: delivery is at-least-once.
 *
 *     npm ci && npm run build
 *     node dist/worker.js --url http://127.0.0.1:8080 --queue emails
 */

import { hostname } from "node:os";
import { parseArgs } from "node:util";
import { JobError, RunleaseError, Worker, type JobContext, type WorkerEvent } from "runlease";

type Payload = { sleep_ms?: number; fail?: string; retryable?: boolean } & Record<string, unknown>;

/** The demonstration handler: its return value is the job's result; a throw fails the attempt. */
async function handle(job: JobContext<Payload>): Promise<unknown> {
  const payload = job.payload ?? {};
  if (typeof payload.fail === "string") {
    throw new JobError(payload.fail, { retryable: payload.retryable !== false });
  }
  let slept = 0;
  while (slept < (payload.sleep_ms ?? 0)) {
    const step = Math.min(100, (payload.sleep_ms ?? 0) - slept);
    await sleep(step, job.signal);
    // Stopped (lost, cancelled, cut off, shut down): the worker decides what is sent.
    if (job.signal.aborted) throw job.signal.reason;
    slept += step;
    job.checkpoint({ slept_ms: slept }); // rides the next heartbeat
  }
  return { echo: payload };
}

/** Resolves after `ms`, or at once when `signal` fires (its listener removed either way). */
function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** One JSON line per event on standard error. */
function log(msg: string, fields: Record<string, unknown> = {}): void {
  process.stderr.write(JSON.stringify({ ts: Date.now() / 1000, msg, ...fields }) + "\n");
}

const ABORTED = { lease_lost: "lease lost", cancel_requested: "cancel requested", unreachable: "no heartbeat for a lease TTL", shutdown: "stopped by the drain" };
const FINISHED = { complete: "job completed", fail: "job failed", release: "job released" };

function logEvent(e: WorkerEvent): void {
  switch (e.type) {
    case "claimed":
      // `via: finish`: the lease rode on a request that carried outcomes.
      return log("job claimed", { job_id: e.lease.job_id, run_lease: e.lease.run_lease, attempt: e.lease.attempt, via: e.withOutcomes ? "finish" : "claim" });
    case "aborted":
      return log(ABORTED[e.reason], { job_id: e.jobId, run_lease: e.runLease });
    case "dropped":
      return log("job dropped", { job_id: e.jobId, run_lease: e.runLease, reason: e.reason === "unreachable" ? "no_heartbeat" : e.reason });
    case "finished":
      return e.status === "ok"
        ? log(FINISHED[e.action], { job_id: e.jobId, run_lease: e.runLease })
        : log("finish refused: lease lost", { job_id: e.jobId, run_lease: e.runLease, action: e.action });
  }
}

const USAGE = `usage: node dist/worker.js [--url URL] [--key KEY] [--queue QUEUE ...] [--worker-id ID]
                          [--concurrency N] [--wait-ms MS] [--grace-ms MS]

  --url URL          the coordinator (default RUNLEASE_URL or http://127.0.0.1:8080)
  --key KEY          a worker API key (default RUNLEASE_KEY)
  --queue QUEUE      a queue to claim from (repeatable; default RUNLEASE_QUEUES or 'default')
  --worker-id ID     default RUNLEASE_WORKER_ID or ts-<host>-<pid>
  --concurrency N    jobs held at once (default 4)
  --wait-ms MS       claim long-poll, 0..60000 (default 10000)
  --grace-ms MS      on SIGTERM, how long running handlers may go on before they
                     are stopped and released (default 10000)`;

function usage(error: string): never {
  process.stderr.write(`${USAGE}\n\nerror: ${error}\n`);
  process.exit(2);
}

function main(): void {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        url: { type: "string" },
        key: { type: "string" },
        queue: { type: "string", multiple: true },
        "worker-id": { type: "string" },
        concurrency: { type: "string" },
        "wait-ms": { type: "string" },
        "grace-ms": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
    }));
  } catch (e) {
    usage(e instanceof Error ? e.message : String(e));
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const integer = (name: string, text: string | undefined, fallback: number): number => {
    const n = text === undefined ? fallback : Number(text);
    return Number.isInteger(n) && n >= (name === "concurrency" ? 1 : 0) ? n : usage(`--${name} must be a whole number, not ${JSON.stringify(text)}`);
  };
  const env = process.env;
  const queues = (values.queue ?? (env["RUNLEASE_QUEUES"] ?? "default").split(",")).map((q) => q.trim()).filter(Boolean);
  const workerId = values["worker-id"] ?? env["RUNLEASE_WORKER_ID"] ?? `ts-${hostname()}-${process.pid}`;
  const key = values.key ?? env["RUNLEASE_KEY"];
  const worker = new Worker<Payload>({
    url: values.url ?? env["RUNLEASE_URL"] ?? "http://127.0.0.1:8080",
    ...(key ? { key } : {}),
    queues,
    workerId,
    concurrency: integer("concurrency", values.concurrency, 4),
    waitMs: integer("wait-ms", values["wait-ms"], 10_000),
    drainTimeoutMs: integer("grace-ms", values["grace-ms"], 10_000),
    handler: handle,
    onEvent: logEvent,
    onError: (e) => log("request failed; retrying", { error: e instanceof Error ? e.message : String(e) }),
  });

  let signals = 0;
  const onSignal = (signal: NodeJS.Signals) => {
    if (signals++ === 0) {
      log("signal received; stopping", { signal });
      void worker.stop();
    } else {
      log("signal received again; stopping handlers now", { signal });
      void worker.stop({ timeoutMs: 0 });
    }
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);

  log("worker started", { worker_id: workerId, queues });
  worker.run().then(
    () => {
      log("worker stopped");
      process.exit(0);
    },
    (e: unknown) => {
      // A claim refused for good (a wrong key, role or queue): exit 1.
      if (e instanceof RunleaseError) {
        log("claim refused; stopping", { error: e.message, status: e.status });
        log("worker stopped");
        process.exit(1);
      }
      log("worker crashed", { error: e instanceof Error ? (e.stack ?? e.message) : String(e) });
      process.exit(70);
    },
  );
}

main();
