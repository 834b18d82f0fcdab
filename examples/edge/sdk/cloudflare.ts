// A runlease endpoint as a Cloudflare Worker, on the runlease library.
//
//   runlease queues set-endpoint reports https://reports.example.workers.dev
//   runlease queues endpoint-secret reports | npx wrangler secret put RUNLEASE_ENDPOINT_SECRET
//   npx wrangler deploy sdk/cloudflare.ts
//
// Short jobs are answered with their result. A job still running after
// handoffAfterMs is answered 202 and goes on under ctx.waitUntil: the
// library heartbeats its lease and completes it through /v1/*.
import { pushHandler } from "runlease";
import { run, type Payload } from "./jobs.ts";

export interface Env {
  /** The queue's endpoint secret, `whsec_...` (during a rotation: "old new"). */
  RUNLEASE_ENDPOINT_SECRET: string;
  /** A worker key for the calls after a 202 (leave unset in open mode). */
  RUNLEASE_KEY?: string;
}

export default {
  fetch(request: Request, env: Env, ctx: ExecutionContext): Promise<Response> {
    const handle = pushHandler<Payload>({
      secret: env.RUNLEASE_ENDPOINT_SECRET.split(" "),
      handler: run,
      handoffAfterMs: 1_000, // well below the endpoint's timeout_ms
      ...(env.RUNLEASE_KEY ? { key: env.RUNLEASE_KEY } : {}),
    });
    return handle(request, { waitUntil: (work) => ctx.waitUntil(work) });
  },
};
