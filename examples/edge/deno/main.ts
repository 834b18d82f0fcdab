// A runlease endpoint as a Deno Deploy handler (or any Deno: `deno run
// --allow-net --allow-env main.ts`).
//
// Verifies the Standard Webhooks signature on the raw body, answers short
// jobs with their result (200 completes), and hands long ones off: 202 at
// once, the work goes on in the background, heartbeating and completing
// through /v1/* with the lease token of the push. Deno has no waitUntil: a
// promise left running keeps going while the isolate lives; if the isolate
// is stopped mid-job, the lease is not renewed, the coordinator's reaper
// takes it back and the job runs again from its last checkpoint.
//
//   (set RUNLEASE_ENDPOINT_SECRET to `runlease queues endpoint-secret reports`
//   in the project's environment variables, deploy main.ts)
//   runlease queues set-endpoint reports https://<project>.deno.dev
import { Webhook } from "npm:standardwebhooks@1.3.0";

interface Push {
  job: { id: string; queue: string; payload: { name?: unknown; pages?: unknown; page_ms?: unknown }; progress: unknown };
  lease: { lease_token: string; lease_ttl_ms: number; heartbeat_interval_ms: number };
  coordinator_url: string;
}

const webhook = new Webhook(Deno.env.get("RUNLEASE_ENDPOINT_SECRET") ?? "");
const key = Deno.env.get("RUNLEASE_KEY"); // a worker key; unset in open mode

/** A refusal the coordinator must not retry: the job fails for good. */
const permanent = (message: string) => new Response(message, { status: 422, headers: { "runlease-no-retry": "true" } });

async function handle(request: Request): Promise<Response> {
  const raw = new Uint8Array(await request.arrayBuffer()); // the bytes that were signed
  let push: Push;
  try {
    push = webhook.verify(raw, Object.fromEntries(request.headers)) as Push;
  } catch (e) {
    return new Response(`signature refused: ${(e as Error).message}`, { status: 401 });
  }
  const { name, pages, page_ms } = push.job.payload;
  if (pages === undefined) {
    if (typeof name !== "string") return permanent("payload.name must be a string");
    return Response.json({ greeting: `hello, ${name}` }); // 200: done, with this result
  }
  if (typeof pages !== "number" || !Number.isInteger(pages) || pages < 0) return permanent("payload.pages must be a whole number");
  report(push, pages, typeof page_ms === "number" ? page_ms : 1000).catch((e) => console.error("report", push.job.id, e));
  return new Response(null, { status: 202 }); // the lease is ours now
}

/** The long job: a heartbeat with the page reached after each page, then complete. */
async function report(push: Push, pages: number, pageMs: number): Promise<void> {
  const call = (path: string, body: unknown) =>
    fetch(new URL(path, push.coordinator_url), {
      method: "POST",
      headers: { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) },
      body: JSON.stringify(body),
    });
  const token = push.lease.lease_token;
  let renewed = Date.now();
  for (let page = (push.job.progress as { page?: number } | null)?.page ?? 0; page < pages; page++) {
    await new Promise((resolve) => setTimeout(resolve, pageMs)); // one page, well under the TTL
    const answer = await call("/v1/heartbeat", { leases: [{ lease_token: token, progress: { page: page + 1 } }] });
    const status = answer.ok ? ((await answer.json()) as { leases: { status: string }[] }).leases[0].status : "error";
    if (status === "lease_lost") return; // someone else runs the job now: send nothing
    if (status === "cancel_requested") return void (await call("/v1/release", { lease_token: token }));
    if (status === "renewed") renewed = Date.now();
    else if (Date.now() - renewed > push.lease.lease_ttl_ms) return; // cut off a whole TTL: stop
  }
  await call("/v1/complete", { lease_token: token, result: { pages } });
}

Deno.serve({ port: Number(Deno.env.get("PORT") ?? 8000) }, (request) =>
  request.method === "POST" ? handle(request) : new Response("a push is a POST", { status: 405 }));
