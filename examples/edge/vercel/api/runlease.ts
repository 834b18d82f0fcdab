// A runlease endpoint as a Vercel function (Node.js runtime, Web handler).
//
// Verifies the Standard Webhooks signature on the raw body, answers short
// jobs with their result (200 completes), and hands long ones off: 202 at
// once, the work goes on under waitUntil, heartbeating and completing
// through /v1/* with the lease token of the push.
//
//   vercel env add RUNLEASE_ENDPOINT_SECRET     (paste `runlease queues endpoint-secret QUEUE`)
//   vercel deploy --prod
//   runlease queues set-endpoint reports https://<project>.vercel.app/api/runlease
import { waitUntil } from "@vercel/functions";
import { Webhook } from "standardwebhooks";

interface Push {
  job: { id: string; queue: string; payload: { name?: unknown; pages?: unknown }; progress: unknown };
  lease: { lease_token: string; lease_ttl_ms: number; heartbeat_interval_ms: number };
  coordinator_url: string;
}

const webhook = new Webhook(process.env.RUNLEASE_ENDPOINT_SECRET ?? "");

export async function POST(request: Request): Promise<Response> {
  const raw = new Uint8Array(await request.arrayBuffer()); // the bytes that were signed
  let push: Push;
  try {
    push = webhook.verify(raw, Object.fromEntries(request.headers)) as Push;
  } catch (e) {
    return new Response(`signature refused: ${(e as Error).message}`, { status: 401 });
  }
  const { name, pages } = push.job.payload;
  if (pages === undefined) {
    if (typeof name !== "string") {
      // A payload that can never work: fail the job without retrying it.
      return new Response("payload.name must be a string", { status: 422, headers: { "runlease-no-retry": "true" } });
    }
    return Response.json({ greeting: `hello, ${name}` }); // 200: done, with this result
  }
  if (typeof pages !== "number" || !Number.isInteger(pages) || pages < 0) {
    return new Response("payload.pages must be a whole number", { status: 422, headers: { "runlease-no-retry": "true" } });
  }
  waitUntil(report(push, pages)); // runs on after the answer, up to the function's maxDuration
  return new Response(null, { status: 202 }); // the lease is ours now
}

/** The long job: a heartbeat with the page reached after each page, then complete. */
async function report(push: Push, pages: number): Promise<void> {
  const key = process.env.RUNLEASE_KEY; // a worker key; unset in open mode
  const call = (path: string, body: unknown) =>
    fetch(new URL(path, push.coordinator_url), {
      method: "POST",
      headers: { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) },
      body: JSON.stringify(body),
    });
  const token = push.lease.lease_token;
  let renewed = Date.now();
  for (let page = (push.job.progress as { page?: number } | null)?.page ?? 0; page < pages; page++) {
    await renderPage(page); // each page well under the lease's TTL
    const answer = await call("/v1/heartbeat", { leases: [{ lease_token: token, progress: { page: page + 1 } }] });
    const status = answer.ok ? ((await answer.json()) as { leases: { status: string }[] }).leases[0].status : "error";
    if (status === "lease_lost") return; // someone else runs the job now: send nothing
    if (status === "cancel_requested") return void (await call("/v1/release", { lease_token: token }));
    if (status === "renewed") renewed = Date.now();
    else if (Date.now() - renewed > push.lease.lease_ttl_ms) return; // cut off a whole TTL: stop
  }
  await call("/v1/complete", { lease_token: token, result: { pages } });
}

async function renderPage(page: number): Promise<void> {
  await new Promise((resolve) => setTimeout(resolve, 1000 + page));
}
