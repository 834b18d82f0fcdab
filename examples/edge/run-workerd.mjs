// Serves the Cloudflare Worker example (dist/cloudflare-worker.mjs, built by
// `npm run build`; or another bundle given as the argument, such as
// dist/sdk-cloudflare-worker.mjs, the Worker on the runlease library) in
// Cloudflare's own runtime, workerd, through miniflare: for local
// development, and for runlease's tests.
//
//   RUNLEASE_ENDPOINT_SECRET=whsec_... [RUNLEASE_KEY=...] [PORT=8787] node run-workerd.mjs [BUNDLE]
//
// Prints {"listening": URL} on a line once it serves, then runs until
// SIGTERM or SIGINT. The Worker's fetch() reaches the coordinator directly.
import { resolve } from "node:path";
import { Miniflare } from "miniflare";

const secret = process.env.RUNLEASE_ENDPOINT_SECRET;
if (!secret) {
  console.error("set RUNLEASE_ENDPOINT_SECRET to the queue's endpoint secret (runlease queues endpoint-secret QUEUE)");
  process.exit(2);
}
const bindings = { RUNLEASE_ENDPOINT_SECRET: secret };
if (process.env.RUNLEASE_KEY) bindings.RUNLEASE_KEY = process.env.RUNLEASE_KEY;
const mf = new Miniflare({
  modules: true,
  scriptPath: process.argv[2] ? resolve(process.argv[2]) : new URL("./dist/cloudflare-worker.mjs", import.meta.url).pathname,
  compatibilityDate: "2025-01-01",
  bindings,
  host: "127.0.0.1",
  port: Number(process.env.PORT ?? 8787),
});
const url = await mf.ready;
console.log(JSON.stringify({ listening: url.href }));
const stop = async () => {
  await mf.dispose();
  process.exit(0);
};
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
