import { Transport } from "./http.js";
import { finishWithRetry, Heartbeater, HeldLease, outcomeOf, type JobContext } from "./lease.js";
import { verify } from "./signature.js";
import type { Dependency, Lease } from "./types.js";
import type { Handler } from "./worker.js";

/** Settings of a push handler. */
export interface PushHandlerOptions<P = unknown> {
  /** The queue's endpoint secret(s) (`whsec_...`): during a rotation, both. */
  secret: string | string[];
  handler: Handler<P>;
  /** Timestamps further than this from now are refused (default 300 s). */
  toleranceS?: number;
  /**
   * How long to wait for the handler before answering 202 and carrying on
   * under `waitUntil`, heartbeating and finishing through `/v1/*` itself.
   * Absent: always wait (keep it below the endpoint's `timeout_ms`).
   */
  handoffAfterMs?: number;
  /** A key for `/v1/*` after a hand-off (worker role); omit in open mode. */
  key?: string;
  /** Overrides the body's `coordinator_url` for a hand-off. */
  coordinatorUrl?: string;
  fetch?: typeof fetch;
  onError?: (error: unknown) => void;
}

/** Per-request hooks of the platform. */
export interface PushRequestOptions {
  /** Keeps the function alive for work after the answer (Cloudflare `ctx.waitUntil`, Vercel `waitUntil`). */
  waitUntil?: (promise: Promise<unknown>) => void;
}

/** The body the coordinator pushes to an endpoint. */
export interface PushBody {
  job: {
    id: string;
    queue: string;
    payload: unknown;
    attempt: number;
    max_attempts: number;
    progress: unknown;
    traceparent?: string;
    dependencies?: Dependency[];
  };
  lease: { lease_token: string; run_lease: number; lease_ttl_ms: number; heartbeat_interval_ms: number };
  coordinator_url: string;
}

function json(status: number, body: unknown, headers: Record<string, string> = {}): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });
}

function refuse(status: number, code: string, message: string): Response {
  return json(status, { error: { code, message } });
}

/**
 * A push handler for an endpoint-served queue: `(request, {waitUntil}) =>
 * Response`. It verifies the Standard Webhooks signature on the raw body,
 * refuses a stale or future timestamp, runs the handler and answers as the
 * coordinator's endpoint table reads it: 200 with the result to complete;
 * 500 (`runlease-no-retry: true` for a `JobError` with `retryable: false`)
 * to fail; 503 with `Retry-After` for `RetryLater`; 202 when the work goes
 * on past `handoffAfterMs`.
 */
export function pushHandler<P = unknown>(
  options: PushHandlerOptions<P>,
): (request: Request, requestOptions?: PushRequestOptions) => Promise<Response> {
  const secrets = Array.isArray(options.secret) ? options.secret : [options.secret];
  const tolerance = options.toleranceS ?? 300;
  return async (request, requestOptions = {}) => {
    if (request.method !== "POST") return refuse(405, "method_not_allowed", "a push is a POST");
    const raw = new Uint8Array(await request.arrayBuffer());
    const refused = await verify(secrets, request.headers, raw, tolerance, Math.floor(Date.now() / 1000));
    if (refused !== null) return refuse(401, "unauthorized", refused);
    let body: PushBody;
    try {
      body = JSON.parse(new TextDecoder().decode(raw)) as PushBody;
      if (typeof body?.lease?.lease_token !== "string" || typeof body?.job?.id !== "string") throw new Error("shape");
    } catch {
      return refuse(400, "bad_request", "the body is not a runlease push");
    }
    const lease: Lease = {
      job_id: body.job.id,
      run_lease: body.lease.run_lease,
      lease_token: body.lease.lease_token,
      queue: body.job.queue,
      payload: body.job.payload,
      attempt: body.job.attempt,
      progress: body.job.progress ?? null,
      lease_ttl_ms: body.lease.lease_ttl_ms,
      heartbeat_interval_ms: body.lease.heartbeat_interval_ms,
      timeout_ms: 0,
      ...(body.job.traceparent === undefined ? {} : { traceparent: body.job.traceparent }),
      ...(body.job.dependencies === undefined ? {} : { dependencies: body.job.dependencies }),
    };
    const held = new HeldLease(lease);
    const settled = (async () => {
      try {
        return { ok: true as const, value: await options.handler(held.context() as JobContext<P>) };
      } catch (error) {
        return { ok: false as const, error };
      }
    })();
    const handoff = options.handoffAfterMs;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const first =
      handoff === undefined
        ? await settled
        : await Promise.race([settled, new Promise<"handoff">((r) => (timer = setTimeout(() => r("handoff"), handoff)))]);
    clearTimeout(timer);
    if (first !== "handoff") return answer(first);
    // Hand-off: from now on this function holds the lease.
    const http = new Transport({
      url: options.coordinatorUrl ?? body.coordinator_url,
      ...(options.key === undefined ? {} : { key: options.key }),
      ...(options.fetch === undefined ? {} : { fetch: options.fetch }),
    });
    const onError = options.onError ?? (() => {});
    const beats = new Heartbeater(http, onError);
    beats.add(held);
    const work = (async () => {
      const outcome = await settled;
      beats.remove(held);
      await beats.stop();
      const item = outcomeOf(held, outcome);
      if (item === null) return held.fence();
      try {
        await finishWithRetry(http, [{ held, item }], onError);
      } catch (e) {
        onError(e);
      }
    })();
    requestOptions.waitUntil?.(work);
    return new Response(null, { status: 202 });
  };
}

function answer(settled: { ok: true; value: unknown } | { ok: false; error: unknown }): Response {
  if (settled.ok) return json(200, settled.value ?? null);
  const e = settled.error as { name?: string; message?: string; retryable?: boolean; retryAfterMs?: number } | null;
  const message = e?.message ?? String(settled.error);
  if (e?.name === "RetryLater") {
    const seconds = Math.max(1, Math.ceil((e.retryAfterMs ?? 1000) / 1000));
    return json(503, { error: { code: "retry_later", message } }, { "retry-after": String(seconds) });
  }
  const noRetry: Record<string, string> = e?.name === "JobError" && e.retryable === false ? { "runlease-no-retry": "true" } : {};
  return json(500, { error: { code: "handler_failed", message } }, noRetry);
}
