// The conformance runner: executes sdk/conformance/scenarios/*.json against a
// live coordinator through this library (see sdk/conformance/README.md).
import { Webhook } from "standardwebhooks";
import { JobError, LeaseAborted, Producer, pushHandler, RetryLater, Worker, type JobContext } from "../dist/index.js";

export interface Env {
  url: string;
  key: string | undefined;
}

export interface Scenario {
  name: string;
  about: string;
  steps: Step[];
}

type Step = Record<string, any> & { do: string };

export interface Report {
  scenario: string;
  ok: boolean;
  ms: number;
  step?: number;
  error?: string;
}

interface Rec {
  path: string;
  body: any;
  status: number | null;
  answer: any;
  after_abort: boolean;
  tokens: string[];
}

interface Run {
  job: string;
  attempt: number;
  run_lease: number;
  progress: unknown;
  aborted: string | null;
}

const tokensOf = (body: any): string[] => {
  if (body === null || typeof body !== "object") return [];
  const out: string[] = [];
  if (typeof body.lease_token === "string") out.push(body.lease_token);
  for (const list of [body.items, body.leases]) {
    if (Array.isArray(list)) for (const i of list) if (typeof i?.lease_token === "string") out.push(i.lease_token);
  }
  return out;
};

/** Everything one scenario run knows. */
class World {
  readonly queue: string;
  readonly jobs = new Map<string, string>();
  readonly workers = new Map<string, { worker: Worker; recorder: Recorder; run: Promise<void> }>();
  readonly leases = new Map<string, any>();
  readonly pushes = new Map<string, Promise<unknown>[]>();
  readonly runs: Run[] = [];
  /** lease token → (job id, run lease), learned from every answer that hands out a lease. */
  readonly tokens = new Map<string, { job: string; run_lease: number }>();
  readonly allRecords: Rec[] = [];
  readonly producer: Producer;

  constructor(readonly env: Env, readonly scenario: Scenario) {
    this.queue = `conf-${scenario.name}-${crypto.randomUUID().slice(0, 8)}`;
    this.producer = new Producer({ url: env.url, ...(env.key ? { key: env.key } : {}) });
  }

  resolve(v: any): any {
    if (typeof v === "string" && v.startsWith("$")) {
      if (v === "$queue") return this.queue;
      if (v === "$url") return this.env.url;
      const [kind, as, field] = v.slice(1).split(".");
      if (kind === "job" && field === "id") return this.need(this.jobs.get(as!), v);
      if (kind === "worker" && field === "id") return this.need(this.workers.get(as!), v).worker.workerId;
      if (kind === "lease") return this.need(this.leases.get(as!), v)[field!];
      return v;
    }
    if (Array.isArray(v)) return v.map((x) => this.resolve(x));
    if (v !== null && typeof v === "object") {
      return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, this.resolve(x)]));
    }
    return v;
  }

  need<T>(v: T | undefined, what: string): T {
    if (v === undefined) throw new Error(`unknown reference ${what}`);
    return v;
  }

  jobId(as: string): string {
    return this.need(this.jobs.get(as), `job ${as}`);
  }

  renewedHeartbeats(job: string, runLease: number): number {
    let n = 0;
    for (const r of this.allRecords) {
      if (r.path !== "/v1/heartbeat" || r.answer === null) continue;
      for (const l of r.answer.leases ?? []) if (l.job_id === job && l.run_lease === runLease && l.status === "renewed") n++;
    }
    return n;
  }

  handler(spec: any) {
    return async (ctx: JobContext): Promise<unknown> => {
      const run: Run = { job: ctx.id, attempt: ctx.attempt, run_lease: ctx.runLease, progress: ctx.progress, aborted: null };
      this.runs.push(run);
      ctx.signal.addEventListener("abort", () => {
        run.aborted = (ctx.signal.reason as LeaseAborted).reason;
      });
      switch (spec.behaviour) {
        case "complete":
          return spec.result ?? null;
        case "heartbeat_then_complete":
          if (spec.progress !== undefined && spec.progress !== null) ctx.checkpoint(spec.progress);
          await until(() => this.renewedHeartbeats(ctx.id, ctx.runLease) >= (spec.heartbeats ?? 1), 15_000, "heartbeats", ctx.signal);
          return spec.result ?? null;
        case "fail":
          throw new JobError(spec.error, {
            retryable: spec.retryable ?? true,
            ...(spec.retry_after_ms === undefined ? {} : { retryAfterMs: spec.retry_after_ms }),
          });
        case "release_then_resume":
          return ctx.progress === null ? ctx.release(spec.progress) : { resumed_from: ctx.progress };
        case "hold_until_aborted":
          await new Promise<void>((resolve) => {
            if (ctx.signal.aborted) resolve();
            ctx.signal.addEventListener("abort", () => resolve());
          });
          return null;
        case "not_now":
          throw new RetryLater(spec.retry_after_ms);
        default:
          throw new Error(`unknown behaviour ${spec.behaviour}`);
      }
    };
  }
}

/** A fetch that records every request and injects the faults a scenario asks for. */
class Recorder {
  readonly records: Rec[] = [];
  drop: { path: string; times: number } | undefined;
  unreachable: string[] = [];

  constructor(readonly world: World) {}

  readonly fetch = async (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const url = new URL(typeof input === "string" ? input : input instanceof URL ? input.href : input.url);
    const path = url.pathname;
    const body = typeof init?.body === "string" ? JSON.parse(init.body) : null;
    const tokens = tokensOf(body);
    const after_abort = tokens.some((t) => {
      const lease = this.world.tokens.get(t);
      return lease !== undefined && this.world.runs.some((r) => r.job === lease.job && r.run_lease === lease.run_lease && r.aborted !== null);
    });
    const rec: Rec = { path, body, status: null, answer: null, after_abort, tokens };
    this.records.push(rec);
    this.world.allRecords.push(rec);
    if (this.unreachable.includes("*") || this.unreachable.includes(path)) {
      throw new TypeError(`fault: ${path} unreachable`);
    }
    const response = await fetch(input, init);
    const text = await response.text();
    const answer = text === "" ? null : JSON.parse(text);
    for (const l of answer?.leases ?? []) {
      if (typeof l?.lease_token === "string") this.world.tokens.set(l.lease_token, { job: l.job_id, run_lease: l.run_lease });
    }
    if (this.drop !== undefined && this.drop.path === path && this.drop.times > 0) {
      this.drop.times--;
      throw new TypeError(`fault: the answer of ${path} was dropped`);
    }
    rec.status = response.status;
    rec.answer = answer;
    return new Response(text, { status: response.status, headers: response.headers });
  };
}

/** Waits for `cond` (checked every 20 ms), failing after `ms`. */
export async function until(cond: () => boolean | Promise<boolean>, ms: number, what: string, signal?: AbortSignal): Promise<void> {
  const deadline = Date.now() + ms;
  while (!(await cond())) {
    if (signal?.aborted) throw signal.reason;
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const typeOf = (v: unknown): string => (v === null ? "null" : Array.isArray(v) ? "array" : typeof v);

/** Matches `actual` against the pattern `want`; throws with the path of the first mismatch. */
export function match(actual: any, want: any, path = "$"): void {
  const fail = (why: string) => {
    throw new Error(`${path}: ${why} (actual ${JSON.stringify(actual)}, want ${JSON.stringify(want)})`);
  };
  if (want !== null && typeof want === "object" && !Array.isArray(want)) {
    const keys = Object.keys(want);
    if (keys.length === 1 && keys[0]!.startsWith("$")) {
      const m = keys[0]!;
      const arg = want[m];
      switch (m) {
        case "$contains":
          if (typeof actual !== "string" || !actual.includes(arg)) fail("does not contain");
          return;
        case "$type":
          if (typeOf(actual) !== arg) fail("wrong type");
          return;
        case "$gte":
          if (typeof actual !== "number" || actual < arg) fail("too small");
          return;
        case "$lte":
          if (typeof actual !== "number" || actual > arg) fail("too large");
          return;
        case "$present":
          if ((actual !== undefined) !== arg) fail(arg ? "absent" : "present");
          return;
        case "$none_after_abort":
          if (!Array.isArray(actual) || actual.length === 0) fail("no requests recorded");
          if (actual.some((r: Rec) => r.after_abort)) fail("a request was sent after the abort");
          return;
        default:
          throw new Error(`unknown matcher ${m}`);
      }
    }
    if (typeOf(actual) !== "object") fail("not an object");
    for (const k of keys) {
      const w = want[k];
      if (w !== null && typeof w === "object" && "$present" in w) {
        match(k in actual ? actual[k] : undefined, w, `${path}.${k}`);
      } else {
        if (!(k in actual)) fail(`missing key ${k}`);
        match(actual[k], w, `${path}.${k}`);
      }
    }
    return;
  }
  if (Array.isArray(want)) {
    if (!Array.isArray(actual)) fail("not an array");
    if (actual.length !== want.length) fail(`length ${actual.length}, want ${want.length}`);
    want.forEach((w, i) => match(actual[i], w, `${path}[${i}]`));
    return;
  }
  if (actual !== want) fail("differs");
}

async function step(w: World, s: Step): Promise<void> {
  const env = w.env;
  switch (s.do) {
    case "enqueue": {
      const job = await w.producer.enqueue({ queue: w.queue, ...w.resolve(s.job) });
      w.jobs.set(s.as, job.id);
      return;
    }
    case "start_worker": {
      const recorder = new Recorder(w);
      const worker = new Worker({
        url: env.url,
        ...(env.key ? { key: env.key } : {}),
        fetch: recorder.fetch as typeof fetch,
        queues: [w.queue],
        workerId: `conf-${s.as}-${crypto.randomUUID().slice(0, 8)}`,
        concurrency: s.concurrency ?? 1,
        waitMs: s.wait_ms ?? 1000,
        handler: w.handler(s.handler),
      });
      w.workers.set(s.as, { worker, recorder, run: worker.run() });
      return;
    }
    case "stop_worker":
      await w.need(w.workers.get(s.worker), s.worker).worker.stop();
      return;
    case "wait_job": {
      const id = w.jobId(s.job);
      const deadline = Date.now() + (s.timeout_ms ?? 15_000);
      for (;;) {
        const job = await w.producer.waitForResult(id, { timeoutMs: Math.min(1000, Math.max(0, deadline - Date.now())) });
        if (job.state === s.state) return;
        if (Date.now() >= deadline) throw new Error(`job ${s.job} is ${job.state}, want ${s.state}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    }
    case "expect_job":
      match(await w.producer.getJob(w.jobId(s.job)), w.resolve(s.expect));
      return;
    case "cancel":
      await w.producer.cancel(w.jobId(s.job));
      return;
    case "wait_handler": {
      const id = w.jobId(s.job);
      const want = s.event === "aborted" ? (r: Run) => r.aborted !== null : () => true;
      await until(() => w.runs.some((r) => r.job === id && want(r)), s.timeout_ms ?? 15_000, `handler ${s.event} of ${s.job}`);
      return;
    }
    case "expect_handler": {
      const id = w.jobId(s.job);
      match(
        w.runs.filter((r) => r.job === id),
        w.resolve(s.runs),
      );
      return;
    }
    case "fault": {
      const r = w.need(w.workers.get(s.worker), s.worker).recorder;
      if (s.drop_answer) r.drop = { path: s.drop_answer.path, times: s.drop_answer.times ?? 1 };
      if (s.unreachable) r.unreachable = s.unreachable.paths;
      return;
    }
    case "heal": {
      const r = w.need(w.workers.get(s.worker), s.worker).recorder;
      r.drop = undefined;
      r.unreachable = [];
      return;
    }
    case "expect_requests": {
      const r = w.need(w.workers.get(s.worker), s.worker).recorder;
      const id = w.jobId(s.job);
      const named = r.records.filter(
        (rec) =>
          (s.path === "*" || rec.path === s.path) &&
          rec.tokens.some((t) => w.tokens.get(t)?.job === id),
      );
      match(named, w.resolve(s.expect));
      return;
    }
    case "claim": {
      const headers: Record<string, string> = { "content-type": "application/json" };
      if (env.key) headers["authorization"] = `Bearer ${env.key}`;
      const response = await fetch(`${env.url}/v1/claim`, {
        method: "POST",
        headers,
        body: JSON.stringify({ queues: [w.queue], worker_id: `conf-claim-${s.as}`, max_jobs: 1, wait_ms: 5000 }),
      });
      const answer: any = await response.json();
      const lease = answer.leases?.[0];
      if (response.status !== 200 || lease === undefined) throw new Error(`claim answered ${response.status} ${JSON.stringify(answer)}`);
      if (lease.job_id !== w.jobId(s.job)) throw new Error(`claimed ${lease.job_id}, want job ${s.job}`);
      w.tokens.set(lease.lease_token, { job: lease.job_id, run_lease: lease.run_lease });
      w.leases.set(s.as, lease);
      return;
    }
    case "push":
      return push(w, s);
    case "wait_push": {
      const promises = w.need(w.pushes.get(s.push), s.push);
      let settled = false;
      const all = Promise.allSettled(promises).then(() => (settled = true));
      await until(() => settled, s.timeout_ms ?? 15_000, `push ${s.push}'s waitUntil`);
      await all;
      return;
    }
    default:
      throw new Error(`unknown step ${s.do}`);
  }
}

function randomSecret(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return `whsec_${btoa(String.fromCharCode(...bytes))}`;
}

async function push(w: World, s: Step): Promise<void> {
  const lease = w.need(w.leases.get(s.lease), s.lease);
  const job = await w.producer.getJob(lease.job_id);
  const body = JSON.stringify({
    job: { id: job.id, queue: job.queue, payload: job.payload, attempt: job.attempt, max_attempts: job.max_attempts, progress: job.progress },
    lease: {
      lease_token: lease.lease_token,
      run_lease: lease.run_lease,
      lease_ttl_ms: lease.lease_ttl_ms,
      heartbeat_interval_ms: lease.heartbeat_interval_ms,
    },
    coordinator_url: w.env.url,
  });
  const id = `${lease.job_id}:${lease.run_lease}`;
  const at = new Date(Date.now() + (s.timestamp_offset_s ?? 0) * 1000);
  const signature = s.signature ?? "valid";
  const key = signature === "forged" ? randomSecret() : s.secret;
  const headers: Record<string, string> = {
    "content-type": "application/json",
    "webhook-id": id,
    "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
    "user-agent": "runlease/conformance",
  };
  if (signature !== "none") headers["webhook-signature"] = new Webhook(key).sign(id, at, body);
  const sent = signature === "tampered" ? body.replace('"job"', '"jOb"') : body;
  const recorder = new Recorder(w);
  const handle = pushHandler({
    secret: s.secret,
    handler: w.handler(s.handler),
    fetch: recorder.fetch as typeof fetch,
    ...(w.env.key ? { key: w.env.key } : {}),
    ...(s.handoff_after_ms === undefined ? {} : { handoffAfterMs: s.handoff_after_ms }),
  });
  const promises: Promise<unknown>[] = [];
  w.pushes.set(s.as, promises);
  const response = await handle(new Request("https://endpoint.test/runlease", { method: "POST", headers, body: sent }), {
    waitUntil: (p) => promises.push(p),
  });
  const text = await response.text();
  let parsed: unknown = null;
  try {
    parsed = text === "" ? null : JSON.parse(text);
  } catch {
    parsed = text;
  }
  const named: Record<string, unknown> = {};
  for (const k of Object.keys(s.expect?.headers ?? {})) named[k] = response.headers.get(k) ?? undefined;
  match({ status: response.status, headers: named, body: parsed }, w.resolve(s.expect));
}

/** Runs one scenario and answers its report line. */
export async function runScenario(env: Env, scenario: Scenario): Promise<Report> {
  const started = Date.now();
  const w = new World(env, scenario);
  let i = 0;
  try {
    for (; i < scenario.steps.length; i++) await step(w, scenario.steps[i]!);
    return { scenario: scenario.name, ok: true, ms: Date.now() - started };
  } catch (e) {
    return { scenario: scenario.name, ok: false, ms: Date.now() - started, step: i, error: `${scenario.steps[i]?.do}: ${e instanceof Error ? e.message : String(e)}` };
  } finally {
    await Promise.all([...w.workers.values()].map(({ worker }) => worker.stop({ timeoutMs: 1000 })));
  }
}
