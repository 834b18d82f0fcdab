// A runlease endpoint as a Vercel function (Node.js runtime, Web handler),
// on the runlease library: put it at api/runlease.ts of a project.
//
//   vercel env add RUNLEASE_ENDPOINT_SECRET     (paste `runlease queues endpoint-secret QUEUE`)
//   vercel deploy --prod
//   runlease queues set-endpoint reports https://<project>.vercel.app/api/runlease
//
// A job still running after handoffAfterMs is answered 202 and goes on
// under Vercel's waitUntil: the library heartbeats and completes it.
import { waitUntil } from "@vercel/functions";
import { pushHandler } from "runlease";
import { run, type Payload } from "./jobs.ts";

const handle = pushHandler<Payload>({
  secret: (process.env.RUNLEASE_ENDPOINT_SECRET ?? "").split(" "),
  handler: run,
  handoffAfterMs: 5_000, // below the endpoint's timeout_ms and the function's maxDuration
  ...(process.env.RUNLEASE_KEY ? { key: process.env.RUNLEASE_KEY } : {}),
});

export function POST(request: Request): Promise<Response> {
  return handle(request, { waitUntil });
}
