// A runlease endpoint as a Deno Deploy handler (or any Deno: `deno run
// --allow-net --allow-env sdk/deno.ts` from examples/edge, whose
// package.json gives the `runlease` import).
//
//   (set RUNLEASE_ENDPOINT_SECRET to `runlease queues endpoint-secret reports`
//   in the project's environment variables, deploy sdk/deno.ts)
//   runlease queues set-endpoint reports https://<project>.deno.dev
//
// Deno has no waitUntil: work handed off after a 202 goes on while the
// isolate lives; if it is stopped mid-job the lease runs out and the job
// runs again from its last checkpoint.
import { pushHandler } from "runlease";
import { run, type Payload } from "./jobs.ts";

const key = Deno.env.get("RUNLEASE_KEY"); // a worker key; unset in open mode
const handle = pushHandler<Payload>({
  secret: (Deno.env.get("RUNLEASE_ENDPOINT_SECRET") ?? "").split(" "),
  handler: run,
  handoffAfterMs: 1_000,
  ...(key ? { key } : {}),
});

Deno.serve({ port: Number(Deno.env.get("PORT") ?? 8000) }, (request) => handle(request));
