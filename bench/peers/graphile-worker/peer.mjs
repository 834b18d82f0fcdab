// graphile-worker measured the way runlease-bench measures a coordinator.
// runlease-bench runs this program as a child process; each mode ends with
// one line of JSON on stdout (errors on stderr, exit status non-zero).
//
//   node peer.mjs drain URL JOBS CONCURRENCY
//     Migrates, adds JOBS no-op jobs 1,000 per addJobs call, prints "ready",
//     waits for a line on stdin, then runs one worker pool in the batched
//     mode (a local queue fetching and locking many jobs per query,
//     completions batched) and prints {"ms": …} once the last job succeeded.
//   node peer.mjs enqueue URL JOBS
//     Migrates, then adds JOBS jobs 1,000 per addJobs call, one call at a
//     time: {"jobs": …, "ms": …}.
//   node peer.mjs open-loop URL RATE SECONDS CONCURRENCY CONNECTIONS GRACE_S
//     Migrates, starts a worker pool of CONCURRENCY in a second Node process
//     (this file, mode open-loop-workers), then adds one job per addJob call
//     on schedule, RATE a second for SECONDS, over a pool of CONNECTIONS
//     connections, whatever the answers. Each payload carries the time its
//     enqueue was due; the workers time enqueue→start when the task function
//     is called and enqueue→done at the job:complete event (the success is
//     then handed to the batched complete). They report once every job has
//     completed or GRACE_S seconds after the last enqueue was due.
import { Logger, run, runMigrations, makeWorkerUtils } from "graphile-worker";
import { createInterface } from "node:readline";
import { fork } from "node:child_process";
import { fileURLToPath } from "node:url";

// Per-job log lines would cost more than the jobs: errors only.
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});

// The batched mode, as runlease-bench drains with it.
function batched(concurrency) {
  return {
    worker: {
      concurrentJobs: concurrency,
      maxPoolSize: Math.max(10, concurrency + 2),
      localQueue: { size: Math.max(500, concurrency + 1) },
      completeJobBatchDelay: 0,
      failJobBatchDelay: 0,
    },
  };
}

async function runner(url, concurrency, taskList) {
  return run({
    connectionString: url,
    concurrency,
    noHandleSignals: true,
    pollInterval: 1000,
    logger,
    taskList,
    preset: batched(concurrency),
  });
}

async function addBatches(url, jobs) {
  const utils = await makeWorkerUtils({ connectionString: url, logger });
  const started = performance.now();
  for (let i = 0; i < jobs; i += 1000) {
    const batch = [];
    for (let j = i; j < Math.min(i + 1000, jobs); j++) batch.push({ identifier: "bench", payload: j });
    await utils.addJobs(batch);
  }
  const ms = performance.now() - started;
  await utils.release();
  return ms;
}

async function drain(url, jobs, concurrency) {
  await runMigrations({ connectionString: url, logger });
  await addBatches(url, jobs);
  console.log("ready");
  const lines = createInterface({ input: process.stdin });
  await new Promise((resolve) => lines.once("line", resolve));
  let done = 0;
  let finish;
  const finished = new Promise((resolve) => (finish = resolve));
  const pool = await runner(url, concurrency, { bench: async () => {} });
  const started = performance.now();
  pool.events.on("job:success", () => {
    done += 1;
    if (done === jobs) finish(performance.now() - started);
  });
  const ms = await finished;
  console.log(JSON.stringify({ ms }));
  await pool.stop();
}

async function enqueue(url, jobs) {
  await runMigrations({ connectionString: url, logger });
  const ms = await addBatches(url, jobs);
  console.log(JSON.stringify({ jobs, ms }));
}

// Milliseconds since the epoch, to the microsecond: comparable between the
// enqueuing process and the workers' on one machine.
const now = () => performance.timeOrigin + performance.now();

function summary(values) {
  values.sort((a, b) => a - b);
  const at = (p) => (values.length ? values[Math.min(values.length - 1, Math.floor(p * values.length))] : null);
  return { n: values.length, p50: at(0.5), p99: at(0.99), max: values.length ? values[values.length - 1] : null };
}

// The worker pool of open-loop, in its own process.
async function openLoopWorkers(url, concurrency) {
  const starts = [];
  const dones = [];
  const pool = await runner(url, concurrency, {
    bench: async (payload) => {
      if (typeof payload?.t === "number") starts.push(now() - payload.t);
    },
  });
  pool.events.on("job:complete", ({ job, error }) => {
    if (!error && typeof job.payload?.t === "number") dones.push(now() - job.payload.t);
  });
  process.send({ ready: true });
  process.on("message", async (m) => {
    if (m.report) {
      process.send({ start: summary(starts), done: summary(dones) });
      await pool.stop();
      process.exit(0);
    }
  });
}

async function openLoop(url, rate, seconds, concurrency, connections, graceS) {
  await runMigrations({ connectionString: url, logger });
  const child = fork(fileURLToPath(import.meta.url), ["open-loop-workers", url, String(concurrency)], {
    stdio: ["ignore", "ignore", "inherit", "ipc"],
  });
  const messages = [];
  let wake = () => {};
  child.on("message", (m) => {
    messages.push(m);
    wake();
  });
  const next = () =>
    new Promise((resolve) => {
      if (messages.length) return resolve(messages.shift());
      wake = () => resolve(messages.shift());
    });
  await next(); // ready
  const utils = await makeWorkerUtils({ connectionString: url, logger, maxPoolSize: connections });
  const total = Math.round(rate * seconds);
  let acked = 0;
  let failed = 0;
  const pending = [];
  const acks = [];
  const t0 = now() + 50;
  let i = 0;
  while (i < total) {
    const t = now();
    while (i < total && t0 + (i * 1000) / rate <= t) {
      const due = t0 + (i * 1000) / rate;
      pending.push(
        utils.addJob("bench", { t: due }).then(
          () => {
            acked++;
            acks.push(now() - due);
          },
          () => failed++,
        ),
      );
      i++;
    }
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  const sendS = (now() - t0) / 1000;
  const deadline = t0 + seconds * 1000 + graceS * 1000;
  // An addJob still unanswered at the deadline counts as not acknowledged.
  const late = new Promise((resolve) => setTimeout(resolve, Math.max(0, deadline - now())));
  await Promise.race([Promise.all(pending), late]);
  const answered = { acked, failed };
  // Ask for the report once the last enqueue's job had time to run.
  while (now() < deadline) {
    const count = await countLeft(url);
    if (count === 0) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  child.send({ report: true });
  const report = await next();
  console.log(
    JSON.stringify({ offered: total, ...answered, send_s: sendS, ack: summary(acks.slice(0, answered.acked)), ...report }),
  );
}

// Jobs not yet completed (graphile-worker deletes a job once it completes).
let countUtils = null;
async function countLeft(url) {
  countUtils ??= await makeWorkerUtils({ connectionString: url, logger, maxPoolSize: 1 });
  const n = await countUtils.withPgClient((c) => c.query("select count(*)::int as n from graphile_worker._private_jobs"));
  return n.rows[0].n;
}

const [mode, url, ...args] = process.argv.slice(2);
const nums = args.map(Number);
try {
  if (mode === "drain") await drain(url, nums[0], nums[1]);
  else if (mode === "enqueue") await enqueue(url, nums[0]);
  else if (mode === "open-loop") await openLoop(url, ...nums);
  else if (mode === "open-loop-workers") await openLoopWorkers(url, nums[0]);
  else throw new Error(`unknown mode ${mode}`);
  if (mode !== "open-loop-workers") {
    await countUtils?.release();
    process.exit(0);
  }
} catch (e) {
  console.error(e);
  process.exit(1);
}
