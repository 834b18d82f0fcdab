// graphile-worker drained the way runlease-bench --drain drains a coordinator:
// node drain.mjs DATABASE_URL JOBS CONCURRENCY
// Migrates, enqueues JOBS no-op jobs 1,000 per add_jobs call, prints "ready",
// waits for a line on stdin, then runs one worker pool in graphile-worker's
// batched mode (a local queue that fetches and locks many jobs per query,
// completions batched) and prints "done MS" once the last job succeeded.
import { Logger, run, runMigrations, makeWorkerUtils } from "graphile-worker";
import { createInterface } from "node:readline";

const [url, jobsArg, concurrencyArg] = process.argv.slice(2);
const jobs = Number(jobsArg);
const concurrency = Number(concurrencyArg);
// Per-job log lines would cost more than the jobs: errors only.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

await runMigrations({ connectionString: url, logger });
const utils = await makeWorkerUtils({ connectionString: url, logger });
for (let i = 0; i < jobs; i += 1000) {
  const batch = [];
  for (let j = i; j < Math.min(i + 1000, jobs); j++) batch.push({ identifier: "bench", payload: j });
  await utils.addJobs(batch);
}
await utils.release();
console.log("ready");
const lines = createInterface({ input: process.stdin });
await new Promise((resolve) => lines.once("line", resolve));

let done = 0;
const finished = new Promise((resolve) => {
  globalThis.benchDone = resolve;
});
const runner = await run({
  connectionString: url,
  concurrency,
  noHandleSignals: true,
  pollInterval: 1000,
  logger,
  taskList: { bench: async () => {} },
  preset: {
    worker: {
      concurrentJobs: concurrency,
      maxPoolSize: Math.max(10, concurrency + 2),
      localQueue: { size: Math.max(500, concurrency + 1) },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    },
  },
});
const started = performance.now();
runner.events.on("job:success", () => {
  done += 1;
  if (done === jobs) globalThis.benchDone(performance.now() - started);
});
const ms = await finished;
console.log(`done ${ms}`);
await runner.stop();
process.exit(0);
