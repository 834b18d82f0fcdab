// A no-op pull worker on the TypeScript library (sdk/typescript, built), for
// `runlease-bench sdk`: node noop_worker.mjs URL QUEUE CONCURRENCY.
// Runs until SIGTERM, then drains.
import { Worker } from "../../sdk/typescript/dist/index.js";

const [url, queue, concurrency] = process.argv.slice(2);
const worker = new Worker({
  url,
  queues: [queue],
  concurrency: Number(concurrency),
  waitMs: 1000,
  handler: () => null,
  onError: (e) => console.error(String(e)),
});
process.on("SIGTERM", () => void worker.stop());
await worker.run();
