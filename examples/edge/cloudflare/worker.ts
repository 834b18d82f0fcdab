// A runlease endpoint as a Cloudflare Worker.
//
// The coordinator claims the queue's jobs and POSTs each one here, signed as
// Standard Webhooks define it. The Worker verifies the signature on the raw
// body, then either answers with the result (a short job: 200 completes it)
// or answers 202 and carries on under ctx.waitUntil (a long job: it holds
// the lease from then on, heartbeats and completes it through /v1/*).
//
//   runlease queues set-endpoint reports https://reports.example.workers.dev
//   runlease queues endpoint-secret reports | npx wrangler secret put RUNLEASE_ENDPOINT_SECRET
//   npx wrangler deploy
import { Webhook } from "standardwebhooks";

export interface Env {
  /** The queue's endpoint secret, `whsec_...`. */
  RUNLEASE_ENDPOINT_SECRET: string;
  /** A worker key for the calls after a 202 (leave unset in open mode). */
  RUNLEASE_KEY?: string;
}

/** The body the coordinator pushes. */
interface Push {
  job: { id: string; queue: string; payload: Payload; attempt: number; max_attempts: number; progress: unknown };
  lease: { lease_token: string; run_lease: number; lease_ttl_ms: number; heartbeat_interval_ms: number };
  coordinator_url: string;
}

/** This queue's jobs: a greeting (short) or a report of some pages (long). */
type Payload = { name?: unknown; pages?: unknown; page_ms?: unknown };

/** A job that can never succeed: answered with `runlease-no-retry: true`. */
class PermanentError extends Error {}

export default {
  async fetch(request: Request, env: Env, ctx: ExecutionContext): Promise<Response> {
    if (request.method !== "POST") return new Response("a push is a POST", { status: 405 });
    // The signature covers the bytes as sent: verify them before parsing.
    const raw = new Uint8Array(await request.arrayBuffer());
    let push: Push;
    try {
      push = new Webhook(env.RUNLEASE_ENDPOINT_SECRET).verify(raw, Object.fromEntries(request.headers)) as Push;
    } catch (e) {
      return new Response(`signature refused: ${(e as Error).message}`, { status: 401 });
    }
    const payload = push.job.payload;
    try {
      if (payload.pages === undefined) return Response.json(greet(payload)); // 200: done, with this result
      const pages = count(payload.pages, "pages");
      ctx.waitUntil(report(push, env, pages, count(payload.page_ms ?? 1000, "page_ms")));
      return new Response(null, { status: 202 }); // the lease is ours now
    } catch (e) {
      // A job that can never work fails for good; anything else is retried.
      if (e instanceof PermanentError) return new Response(e.message, { status: 422, headers: { "runlease-no-retry": "true" } });
      return new Response((e as Error).message, { status: 500 });
    }
  },
};

function greet(payload: Payload): { greeting: string } {
  if (typeof payload.name !== "string") throw new PermanentError("payload.name must be a string");
  return { greeting: `hello, ${payload.name}` };
}

function count(v: unknown, what: string): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 10_000) {
    throw new PermanentError(`payload.${what} must be a whole number from 0 to 10000`);
  }
  return v;
}

/**
 * The long job, after the 202: one page at a time (each well under the
 * lease's TTL), a heartbeat with the page reached as progress after each,
 * then complete. It resumes from the progress of an earlier attempt.
 */
async function report(push: Push, env: Env, pages: number, pageMs: number): Promise<void> {
  const token = push.lease.lease_token;
  const call = (path: string, body: unknown) =>
    fetch(new URL(path, push.coordinator_url), {
      method: "POST",
      headers: { "content-type": "application/json", ...(env.RUNLEASE_KEY ? { authorization: `Bearer ${env.RUNLEASE_KEY}` } : {}) },
      body: JSON.stringify(body),
    });
  const done = (push.job.progress as { page?: number } | null)?.page ?? 0;
  let renewed = Date.now();
  for (let page = done; page < pages; page++) {
    await new Promise((resolve) => setTimeout(resolve, pageMs)); // render one page
    const answer = await call("/v1/heartbeat", { leases: [{ lease_token: token, progress: { page: page + 1 } }] });
    const status = answer.ok ? ((await answer.json()) as { leases: { status: string }[] }).leases[0].status : "error";
    if (status === "lease_lost") return; // the job is someone else's now: send nothing
    if (status === "cancel_requested") {
      await call("/v1/release", { lease_token: token }); // acknowledges the cancel
      return;
    }
    if (status === "renewed") renewed = Date.now();
    // Not renewed for a whole TTL: the lease may be gone (reaped, the job
    // claimed again), so stop and send nothing; the job runs again.
    else if (Date.now() - renewed > push.lease.lease_ttl_ms) return;
  }
  const answer = await call("/v1/complete", { lease_token: token, result: { pages } });
  if (!answer.ok && answer.status !== 409) throw new Error(`complete answered ${answer.status}`);
}
