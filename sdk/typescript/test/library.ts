// The library's own tests beyond the conformance scenarios: producer calls and
// typed errors, bounded concurrency, finish-and-claim, drain, deadline-aware
// claims, several signatures. Each runs on a queue of its own.
import { Webhook } from "standardwebhooks";
import { LeaseAborted, Producer, pushHandler, RunleaseError, Worker, type Job, type JobContext, type WorkerEvent } from "../dist/index.js";
import { match, until, type Env } from "./conformance.js";

export interface LibraryTest {
  name: string;
  run(env: Env): Promise<void>;
}

const queue = (name: string) => `lib-${name}-${crypto.randomUUID().slice(0, 8)}`;
const conn = (env: Env) => ({ url: env.url, ...(env.key ? { key: env.key } : {}) });

function assert(cond: unknown, what: string): asserts cond {
  if (!cond) throw new Error(`assertion failed: ${what}`);
}

async function rejects(p: Promise<unknown>): Promise<RunleaseError> {
  try {
    await p;
  } catch (e) {
    assert(e instanceof RunleaseError, `a RunleaseError, got ${String(e)}`);
    return e;
  }
  throw new Error("expected a rejection");
}

/** A fetch that records the path and body of every request. */
function recording(): { fetch: typeof fetch; sent: { path: string; body: any }[] } {
  const sent: { path: string; body: any }[] = [];
  return {
    sent,
    fetch: (async (input: RequestInfo | URL, init?: RequestInit) => {
      const url = new URL(typeof input === "string" ? input : input instanceof URL ? input.href : input.url);
      sent.push({ path: url.pathname, body: typeof init?.body === "string" ? JSON.parse(init.body) : null });
      return fetch(input, init);
    }) as typeof fetch,
  };
}

export const libraryTests: LibraryTest[] = [
  {
    name: "producer_enqueue_batch_get_wait_and_typed_errors",
    async run(env) {
      const q = queue("producer");
      const p = new Producer(conn(env));
      const one = await p.enqueue({ queue: q, payload: { n: 1 }, idempotency_key: "k1" });
      match(one, { queue: q, state: "queued", payload: { n: 1 }, attempt: 0, run_lease: 0 });
      const again = await p.enqueue({ queue: q, payload: { n: 99 }, idempotency_key: "k1" });
      assert(again.id === one.id, "a repeated idempotency key answers the original job");
      const batch = await p.enqueueBatch([
        { queue: q, payload: { n: 2 } },
        { queue: q, payload: { n: 3 }, priority: -1 },
      ]);
      match(batch.map((j) => j.payload), [{ n: 2 }, { n: 3 }]);
      match(await p.getJob(batch[1]!.id), { id: batch[1]!.id, priority: -1, attempts: [] });

      const missing = await rejects(p.getJob("0197a3c2-5b1e-7c3a-9f2e-3b8d1c0a4e51"));
      match({ code: missing.code, status: missing.status }, { code: "not_found", status: 404 });
      const invalid = await rejects(p.enqueue({ queue: "no spaces allowed", payload: 1 }));
      match({ code: invalid.code, status: invalid.status }, { code: "invalid", status: 422 });
      const down = await rejects(new Producer({ url: "http://127.0.0.1:9" }).getJob(one.id));
      match({ code: down.code, status: down.status, transient: down.transient }, { code: "unreachable", status: 0, transient: true });

      const worker = new Worker({ ...conn(env), queues: [q], concurrency: 3, waitMs: 500, handler: (j) => ({ doubled: (j.payload as { n: number }).n * 2 }) });
      void worker.run();
      const waited: Job = await p.waitForResult(batch[0]!.id, { timeoutMs: 15_000 });
      await worker.stop();
      match(waited, { state: "done", result: { doubled: 4 } });
      const cancelled = await rejects(p.cancel(waited.id));
      match({ code: cancelled.code, status: cancelled.status }, { code: "conflict", status: 409 });
    },
  },
  {
    name: "a_dependent_runs_after_its_dependency_and_sees_its_result",
    async run(env) {
      const q = queue("deps");
      const p = new Producer(conn(env));
      const [first, second] = await p.enqueueBatch([
        { queue: q, payload: { step: 1 }, ref: "first" },
        { queue: q, payload: { step: 2 }, depends_on: ["first"] },
      ]);
      match(second, { state: "blocked" });
      const seen: { id: string; dependencies: unknown }[] = [];
      const worker = new Worker({
        ...conn(env),
        queues: [q],
        concurrency: 2,
        waitMs: 500,
        handler: (j: JobContext) => {
          seen.push({ id: j.id, dependencies: j.dependencies });
          return { step: (j.payload as { step: number }).step };
        },
      });
      void worker.run();
      match(await p.waitForResult(second!.id, { timeoutMs: 15_000 }), { state: "done", result: { step: 2 } });
      await worker.stop();
      match(
        seen.map((s) => s.id),
        [first!.id, second!.id],
      );
      match(seen[0]!.dependencies, []);
      match(seen[1]!.dependencies, [{ id: first!.id, state: "done", result: { step: 1 } }]);
    },
  },
  {
    name: "worker_bounds_concurrency_and_sends_outcomes_with_claims",
    async run(env) {
      const q = queue("concurrency");
      const p = new Producer(conn(env));
      const jobs = await p.enqueueBatch(Array.from({ length: 12 }, (_, n) => ({ queue: q, payload: { n } })));
      let inFlight = 0;
      let peak = 0;
      let release: () => void = () => {};
      const full = new Promise<void>((r) => (release = r));
      const rec = recording();
      const worker = new Worker({
        ...conn(env),
        fetch: rec.fetch,
        queues: [q],
        concurrency: 4,
        waitMs: 500,
        handler: async (j: JobContext) => {
          inFlight++;
          peak = Math.max(peak, inFlight);
          if (inFlight === 4) release();
          await full;
          inFlight--;
          return j.payload;
        },
      });
      void worker.run();
      for (const j of jobs) match(await p.waitForResult(j.id, { timeoutMs: 15_000 }), { state: "done", result: j.payload });
      await worker.stop();
      assert(peak === 4, `peak concurrency ${peak}, want 4`);
      const paths = new Set(rec.sent.map((s) => s.path));
      assert(!paths.has("/v1/complete") && !paths.has("/v1/claim"), `only /v1/finish and /v1/heartbeat, got ${[...paths]}`);
      const carried = rec.sent.filter((s) => s.path === "/v1/finish" && s.body.claim && s.body.items.length > 0);
      assert(carried.length > 0, "some outcomes rode a claim");
      const completed = rec.sent.flatMap((s) => (s.path === "/v1/finish" ? s.body.items : [])).filter((i: any) => i.action === "complete");
      assert(completed.length === 12, `12 completions sent once each, got ${completed.length}`);
    },
  },
  {
    name: "drain_finishes_quick_work_and_releases_the_rest_with_its_checkpoint",
    async run(env) {
      const q = queue("drain");
      const p = new Producer(conn(env));
      const quick = await p.enqueue({ queue: q, payload: "quick", priority: 0 });
      const slow = await p.enqueue({ queue: q, payload: "slow", priority: 1 });
      let started = 0;
      let reason: string | undefined;
      let finishQuick: () => void = () => {};
      const quickGate = new Promise<void>((r) => (finishQuick = r));
      const worker = new Worker({
        ...conn(env),
        queues: [q],
        concurrency: 2,
        waitMs: 500,
        handler: async (j) => {
          started++;
          if (j.payload === "quick") {
            await quickGate;
            return "finished while draining";
          }
          j.checkpoint({ at: "half" });
          await new Promise<void>((r) => j.signal.addEventListener("abort", () => r()));
          reason = (j.signal.reason as LeaseAborted).reason;
          throw j.signal.reason;
        },
      });
      void worker.run();
      await until(() => started === 2, 10_000, "both handlers started");
      const stopped = worker.stop({ timeoutMs: 300 });
      finishQuick();
      await stopped;
      assert(reason === "shutdown", `the slow handler saw ${reason}, want shutdown`);
      match(await p.getJob(quick.id), { state: "done", result: "finished while draining" });
      match(await p.getJob(slow.id), { state: "queued", attempt: 0, progress: { at: "half" }, attempts: [{ outcome: "released" }] });
    },
  },
  {
    name: "a_second_stop_with_no_time_aborts_the_drain_at_once",
    async run(env) {
      const q = queue("second-stop");
      const p = new Producer(conn(env));
      const job = await p.enqueue({ queue: q, payload: "long" });
      let reason: string | undefined;
      let started = false;
      const worker = new Worker({
        ...conn(env),
        queues: [q],
        waitMs: 300,
        handler: async (j) => {
          started = true;
          j.checkpoint({ step: 1 });
          await new Promise<void>((r) => j.signal.addEventListener("abort", () => r()));
          reason = (j.signal.reason as LeaseAborted).reason;
          throw j.signal.reason;
        },
      });
      void worker.run();
      await until(() => started, 10_000, "the handler started");
      const first = worker.stop(); // the default drain: 30 s
      const t0 = Date.now();
      await worker.stop({ timeoutMs: 0 }); // a second signal
      await first;
      assert(Date.now() - t0 < 5_000, `the second stop took ${Date.now() - t0} ms`);
      assert(reason === "shutdown", `the handler saw ${reason}, want shutdown`);
      match(await p.getJob(job.id), { state: "queued", attempt: 0, progress: { step: 1 }, attempts: [{ outcome: "released" }] });
    },
  },
  {
    name: "deadline_aware_claims_take_only_jobs_that_fit",
    async run(env) {
      const q = queue("deadline");
      const p = new Producer(conn(env));
      const long = await p.enqueue({ queue: q, payload: "long", timeout_ms: 120_000, priority: 0 });
      const short = await p.enqueue({ queue: q, payload: "short", timeout_ms: 5_000, priority: 1 });
      const ran: unknown[] = [];
      const rec = recording();
      const worker = new Worker({ ...conn(env), fetch: rec.fetch, queues: [q], waitMs: 300, timeLeftMs: () => 60_000, handler: (j) => void ran.push(j.payload) });
      void worker.run();
      match(await p.waitForResult(short.id, { timeoutMs: 10_000 }), { state: "done" });
      await worker.stop();
      match(ran, ["short"]);
      match(await p.getJob(long.id), { state: "queued", run_lease: 0 });
      const claim = rec.sent.find((s) => s.body?.claim)?.body.claim;
      assert(claim.time_left_ms > 0 && claim.time_left_ms <= 60_000, `time_left_ms ${claim.time_left_ms}`);

      // A worker whose time is (nearly) up drains at once: it claims nothing.
      const late = new Worker({ ...conn(env), queues: [q], waitMs: 300, timeLeftMs: () => 1_500, handler: () => null });
      await late.run();
      match(await p.getJob(long.id), { state: "queued", run_lease: 0 });
    },
  },
  {
    name: "events_tell_each_lease_and_a_refused_claim_ends_run",
    async run(env) {
      const q = queue("events");
      const p = new Producer(conn(env));
      const ok = await p.enqueue({ queue: q, payload: "ok" });
      const bad = await p.enqueue({ queue: q, payload: "bad", max_attempts: 1, priority: 1 });
      const events: WorkerEvent[] = [];
      const worker = new Worker({
        ...conn(env),
        queues: [q],
        waitMs: 300,
        onEvent: (e) => events.push(e),
        handler: (j) => {
          if (j.payload === "bad") throw new Error("bad payload");
          return "fine";
        },
      });
      void worker.run();
      match(await p.waitForResult(ok.id, { timeoutMs: 10_000 }), { state: "done", result: "fine" });
      match(await p.waitForResult(bad.id, { timeoutMs: 10_000 }), { state: "failed", error: { $contains: "bad payload" } });
      await worker.stop();
      const of = (id: string) =>
        events.filter((e) => (e.type === "claimed" ? e.lease.job_id : e.jobId) === id).map((e) => (e.type === "finished" ? `${e.type}:${e.action}:${e.status}` : e.type));
      match(of(ok.id), ["claimed", "finished:complete:ok"]);
      match(of(bad.id), ["claimed", "finished:fail:ok"]);

      // A claim the coordinator refuses (here: an invalid queue name) will not heal by retrying: run() rejects.
      const refused = await rejects(new Worker({ ...conn(env), queues: ["no spaces allowed"], waitMs: 300, handler: () => null }).run());
      match({ code: refused.code, status: refused.status }, { code: "invalid", status: 422 });
    },
  },
  {
    name: "push_accepts_any_live_key_during_a_rotation",
    async run() {
      const bytes = (n: number) => btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(n))));
      const oldKey = `whsec_${bytes(32)}`;
      const newKey = `whsec_${bytes(32)}`;
      const handle = pushHandler({ secret: [newKey, oldKey], handler: (j) => ({ echo: j.payload }) });
      const body = JSON.stringify({
        job: { id: "0197a3c2-5b1e-7c3a-9f2e-3b8d1c0a4e51", queue: "q", payload: { a: 1 }, attempt: 1, max_attempts: 4, progress: null },
        lease: { lease_token: "rl2.x", run_lease: 1, lease_ttl_ms: 15000, heartbeat_interval_ms: 5000 },
        coordinator_url: "http://127.0.0.1:9",
      });
      const at = new Date();
      const id = "0197a3c2-5b1e-7c3a-9f2e-3b8d1c0a4e51:1";
      const forged = new Webhook(`whsec_${bytes(32)}`).sign(id, at, body);
      const headers = {
        "webhook-id": id,
        "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
        "webhook-signature": `${forged} ${new Webhook(oldKey).sign(id, at, body)}`,
      };
      const ok = await handle(new Request("https://e.test/", { method: "POST", headers, body }));
      match({ status: ok.status, body: await ok.json() }, { status: 200, body: { echo: { a: 1 } } });
      const onlyForged = await handle(new Request("https://e.test/", { method: "POST", headers: { ...headers, "webhook-signature": forged }, body }));
      assert(onlyForged.status === 401, `a forged signature alone is 401, got ${onlyForged.status}`);
    },
  },
];
