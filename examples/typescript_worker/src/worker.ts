/**
 * A runlease worker in TypeScript with no SDK: Node's own `fetch`, nothing else
 * at run time.
 *
 * It speaks the v1 protocol over HTTP (docs/protocol.md, docs/openapi.yaml)
 * and keeps the rules of docs/workers.md:
 *
 * - claims with a long-poll (`POST /v1/claim`, `wait_ms`) up to its free
 *   slots, so at most `--concurrency` handlers run at once;
 * - heartbeats every held lease in one request per interval
 *   (`POST /v1/heartbeat`, at the `heartbeat_interval_ms` the lease says),
 *   carrying the handler's latest checkpoint as `progress`;
 * - stops a handler (its `job.signal` aborts) when its lease is lost
 *   (`lease_lost`: the job is dropped, nothing is sent), when a cancel is
 *   requested (`cancel_requested`: acknowledged with a fail that is not
 *   retryable), when the job's `timeout_ms` has passed (a retryable fail), or
 *   when no heartbeat has succeeded for a whole lease TTL (self-fencing: it
 *   cannot know whether it still holds the lease, so it stops and sends
 *   nothing, as the coordinator will reap it);
 * - sends the outcomes of jobs that end together in one `POST /v1/finish`
 *   (while one request is in flight the next gathers); finishing is
 *   idempotent per lease, so a lost answer or a 503 is retried;
 * - claims a job for each slot those outcomes free in that same request
 *   (its `claim`, with `wait_ms` 0: the coordinator claims once the outcomes
 *   are committed), so a busy worker spends one request per cycle; slots it
 *   brings no job for go back to the long-polling claim loop;
 * - drains on SIGTERM or SIGINT: stops claiming (a claim already parked is
 *   let answer, and what it brings is released at once), lets running
 *   handlers finish for `--grace-ms`, stops the rest and releases them with
 *   their checkpoint, then exits 0. A second signal cuts the grace short.
 *
 * Handlers must be replay-safe: delivery is at-least-once. `job.jobId` and
 * `job.runLease` together are a fencing token to stamp on side effects.
 *
 * The handler below is a demonstration: it echoes the payload, and
 * understands `{"sleep_ms": N}` (works N ms, checkpointing its progress) and
 * `{"fail": "message", "retryable": false}` (fails). Replace `handle` with
 * your own.
 *
 *     npm ci && npm run build
 *     node dist/worker.js --url http://127.0.0.1:8080 --queue emails
 */

import { hostname } from "node:os";
import { performance } from "node:perf_hooks";
import { parseArgs } from "node:util";

// ---------------------------------------------------------------------------
// What a handler sees
// ---------------------------------------------------------------------------

/** Throw from a handler to fail the attempt with this message. */
export class JobFailed extends Error {
  constructor(
    message: string,
    readonly retryable: boolean = true,
    readonly retryAfterMs?: number,
  ) {
    super(message);
    this.name = "JobFailed";
  }
}

/** Why a handler was asked to stop. */
export type StopReason = "cancel_requested" | "lease_lost" | "no_heartbeat" | "timeout" | "shutdown";

/** Thrown by `Job.check` and `Job.sleep` (and `job.signal`'s reason) once the handler must stop. */
export class Stopped extends Error {
  constructor(readonly reason: StopReason) {
    super(`stopped: ${reason}`);
    this.name = "Stopped";
  }
}

/** One lease, as `POST /v1/claim` answers it. */
interface Lease {
  job_id: string;
  run_lease: number;
  lease_token: string;
  queue: string;
  payload: unknown;
  attempt: number;
  progress: unknown;
  lease_ttl_ms: number;
  heartbeat_interval_ms: number;
  timeout_ms: number;
}

/** A lease is taken to start at most this long before the claim's answer arrived. */
const MAX_ANSWER_ALLOWANCE_MS = 1_000;

/** One claimed job, as the handler sees it. */
export class Job {
  readonly jobId: string;
  readonly runLease: number;
  readonly leaseToken: string;
  readonly queue: string;
  readonly payload: unknown;
  readonly attempt: number;
  /** The last checkpoint: an earlier attempt's at first, then this one's. */
  progress: unknown;
  readonly leaseTtlMs: number;
  readonly heartbeatIntervalMs: number;
  readonly timeoutMs: number;
  /** Aborts (with a `Stopped` reason) once the handler must stop: pass it to `fetch` and friends. */
  readonly signal: AbortSignal;
  /** Why the handler was stopped; null while it may run. */
  stopReason: StopReason | null = null;
  /** When the coordinator granted the lease, as near as we can tell and never later (monotonic ms). */
  readonly grantedAt: number;
  /** When the last heartbeat that succeeded was *sent* (at first: the grant). */
  private renewedAt: number;
  /** Set once the job's outcome is decided: no more stops, no more timers. */
  private settled = false;
  private readonly controller = new AbortController();
  /** A checkpoint no heartbeat has carried yet (boxed, so a `null` checkpoint is one too). */
  private unsent: { progress: unknown } | null = null;
  private fenceTimer: NodeJS.Timeout | undefined;
  private timeoutTimer: NodeJS.Timeout | undefined;

  /** A lease whose claim was sent at `sent` and answered at `received` (monotonic ms). */
  constructor(lease: Lease, sent: number, received: number) {
    this.jobId = lease.job_id;
    this.runLease = lease.run_lease;
    this.leaseToken = lease.lease_token;
    this.queue = lease.queue;
    this.payload = lease.payload;
    this.attempt = lease.attempt;
    this.progress = lease.progress ?? null;
    this.leaseTtlMs = lease.lease_ttl_ms;
    this.heartbeatIntervalMs = lease.heartbeat_interval_ms;
    this.timeoutMs = lease.timeout_ms;
    this.signal = this.controller.signal;
    // The coordinator granted the lease between the claim's sending and its
    // answer; a parked claim's statement runs just before it answers, so the
    // lease is taken to start a little before the answer, never before the
    // claim was sent. Fencing and the timeout count from there.
    const allowance = Math.min(this.leaseTtlMs / 4, MAX_ANSWER_ALLOWANCE_MS);
    this.grantedAt = Math.max(sent, received - allowance);
    this.renewedAt = this.grantedAt;
    this.timeoutTimer = setTimeout(() => this.stop("timeout"), this.grantedAt + this.timeoutMs - now());
    this.armFence();
  }

  /** Asks the handler to stop (the first reason wins). */
  stop(reason: StopReason): void {
    if (this.stopReason !== null || this.settled) return;
    this.stopReason = reason;
    this.controller.abort(new Stopped(reason));
  }

  /** Whether the handler should stop now. */
  get stopping(): boolean {
    return this.stopReason !== null;
  }

  /** Throws `Stopped` once the handler should stop. */
  check(): void {
    if (this.stopReason !== null) throw new Stopped(this.stopReason);
  }

  /** Waits `ms`, rejecting early with `Stopped` when the handler must stop. */
  sleep(ms: number): Promise<void> {
    this.check();
    return new Promise((resolve, reject) => {
      const onStop = () => {
        clearTimeout(timer);
        reject(new Stopped(this.stopReason ?? "shutdown"));
      };
      const timer = setTimeout(() => {
        this.signal.removeEventListener("abort", onStop);
        resolve();
      }, ms);
      this.signal.addEventListener("abort", onStop, { once: true });
    });
  }

  /** Saves `progress`: it goes out with the next heartbeat (and a release at shutdown). */
  checkpoint(progress: unknown): void {
    this.progress = progress;
    this.unsent = { progress };
  }

  // ---- for the worker ----

  /** The checkpoint to send with this heartbeat, if one is new. */
  takeCheckpoint(): { progress: unknown } | null {
    return this.unsent;
  }

  /** A heartbeat sent at `sent`, carrying `carried`, renewed the lease. */
  renewed(sent: number, carried: { progress: unknown } | null): void {
    if (carried !== null && this.unsent === carried) this.unsent = null;
    if (sent > this.renewedAt) {
      this.renewedAt = sent;
      this.armFence();
    }
  }

  /**
   * Fences the handler now if a whole TTL has passed since the last renewal
   * (its timer may be about to fire): no heartbeat is sent for it any more.
   */
  fenceIfDue(): void {
    if (now() >= this.renewedAt + this.leaseTtlMs) this.stop("no_heartbeat");
  }

  /** Whether the outcome is decided. */
  get isSettled(): boolean {
    return this.settled;
  }

  /** The outcome is decided: stop the timers; later stops change nothing. */
  settle(): void {
    this.settled = true;
    clearTimeout(this.fenceTimer);
    clearTimeout(this.timeoutTimer);
  }

  /** Self-fencing: a whole TTL after the last renewal, the lease may be someone else's. */
  private armFence(): void {
    if (this.settled) return;
    clearTimeout(this.fenceTimer);
    this.fenceTimer = setTimeout(
      () => {
        if (now() >= this.renewedAt + this.leaseTtlMs) this.stop("no_heartbeat");
        else this.armFence();
      },
      Math.max(0, this.renewedAt + this.leaseTtlMs - now()),
    );
  }
}

// ---------------------------------------------------------------------------
// The demonstration handler: replace it with your own
// ---------------------------------------------------------------------------

/**
 * Returns the job's result, or throws `JobFailed`. Check `job.signal` (or use
 * `job.sleep`) to stop in time.
 */
async function handle(job: Job): Promise<unknown> {
  const payload = isObject(job.payload) ? job.payload : {};
  if ("fail" in payload) {
    const retryable = payload["retryable"] === undefined ? true : Boolean(payload["retryable"]);
    throw new JobFailed(String(payload["fail"]), retryable);
  }
  const sleepMs = payload["sleep_ms"];
  if (typeof sleepMs === "number" && sleepMs > 0) {
    // Resume from the checkpoint an earlier attempt saved.
    const saved = isObject(job.progress) ? job.progress["slept_ms"] : undefined;
    let done = typeof saved === "number" ? saved : 0;
    const step = 100;
    while (done < sleepMs) {
      await job.sleep(Math.min(step, sleepMs - done));
      done += step;
      job.checkpoint({ slept_ms: Math.min(done, sleepMs) });
    }
  }
  return { echo: job.payload, attempt: job.attempt, run_lease: job.runLease };
}

// ---------------------------------------------------------------------------
// JSON over HTTP to one coordinator
// ---------------------------------------------------------------------------

/** A non-2xx answer, with the protocol's error code. */
class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly retryAfterMs: number | null,
  ) {
    super(`${status} ${code}: ${message}`);
    this.name = "ApiError";
  }
}

class Coordinator {
  readonly url: string;

  constructor(
    url: string,
    private readonly key: string | undefined,
  ) {
    this.url = url.replace(/\/+$/, "");
  }

  /** One POST; throws `ApiError` for a non-2xx answer and anything else for a transport failure. */
  async post<T>(path: string, body: unknown, timeoutMs: number): Promise<T> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (this.key) headers["authorization"] = `Bearer ${this.key}`;
    const response = await fetch(this.url + path, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      // (AbortSignal.timeout takes whole milliseconds only.)
      signal: AbortSignal.timeout(Math.ceil(timeoutMs)),
    });
    const text = await response.text();
    if (!response.ok) {
      let code = "http";
      let message = text.slice(0, 200);
      try {
        const error = (JSON.parse(text) as { error?: { code?: unknown; message?: unknown } }).error;
        if (typeof error?.code === "string") code = error.code;
        if (typeof error?.message === "string") message = error.message;
      } catch {
        // Not the protocol's error body (a proxy in between): keep the text.
      }
      const retryAfter = Number.parseFloat(response.headers.get("retry-after") ?? "");
      throw new ApiError(
        response.status,
        code,
        message,
        Number.isFinite(retryAfter) ? retryAfter * 1000 : null,
      );
    }
    return JSON.parse(text) as T;
  }

  /** POST, retried on transport errors and 503: for calls that are safe to repeat only (never a claim). */
  async postRetrying<T>(path: string, body: unknown, timeoutMs: number, tries = 6): Promise<T> {
    let backoff = 200;
    for (let attempt = 1; ; attempt++) {
      try {
        return await this.post<T>(path, body, timeoutMs);
      } catch (e) {
        const retryable = !(e instanceof ApiError) || e.status === 503;
        if (!retryable || attempt >= tries) throw e;
        await delay(e instanceof ApiError && e.retryAfterMs !== null ? e.retryAfterMs : jitter(backoff));
        backoff = Math.min(backoff * 2, 5_000);
      }
    }
  }
}

interface ClaimAnswer {
  leases: Lease[];
}
type HeartbeatStatus = "renewed" | "cancel_requested" | "lease_lost";
interface HeartbeatAnswer {
  leases: { job_id: string; run_lease: number; status: HeartbeatStatus }[];
}
type FinishItem =
  | { lease_token: string; action: "complete"; result: unknown }
  | { lease_token: string; action: "fail"; error: string; retryable: boolean; retry_after_ms?: number }
  | { lease_token: string; action: "release"; progress?: unknown };
interface FinishResult {
  job_id: string;
  run_lease: number;
  status: "ok" | "lease_lost";
  state: string | null;
}
interface FinishAnswer {
  items: FinishResult[];
  /** Present when the request carried a claim. */
  leases?: Lease[];
}

/** Claims riding on finish requests: what to ask for, and what to do with the leases. */
interface ClaimRider {
  /** The claim for `slots` freed slots, or null (stopping: claim nothing). */
  claim(slots: number): Record<string, unknown> | null;
  /** Starts the leases a finish request's claim brought (sent and answered at these monotonic ms). */
  start(leases: Lease[], sent: number, received: number): void;
}

// ---------------------------------------------------------------------------
// Finishing: outcomes of concurrent jobs share `POST /v1/finish` requests
// ---------------------------------------------------------------------------

/** Most items in one finish or heartbeat request. */
const MAX_ITEMS_PER_REQUEST = 1000;
const FINISH_TIMEOUT_MS = 10_000;

class Finisher {
  private queue: { item: FinishItem; frees: boolean; done: (r: FinishResult | Error) => void }[] = [];
  private sending = false;

  constructor(
    private readonly api: Coordinator,
    private readonly rider: ClaimRider,
  ) {}

  /**
   * Sends `item` with the next request; resolves to its own result, or to
   * the error that kept it out. With `frees`, the request also claims a job
   * for the slot the item's job leaves.
   */
  submit(item: FinishItem, frees: boolean): Promise<FinishResult | Error> {
    return new Promise((done) => {
      this.queue.push({ item, frees, done });
      if (!this.sending) void this.sendAll();
    });
  }

  private async sendAll(): Promise<void> {
    this.sending = true;
    try {
      // Jobs that end together hand in their outcomes within a turn of the
      // event loop: let them, so they share this request.
      await new Promise((r) => setImmediate(r));
      while (this.queue.length > 0) {
        const batch = this.queue.splice(0, MAX_ITEMS_PER_REQUEST);
        const claim = this.rider.claim(batch.filter((p) => p.frees).length);
        const results = await this.send(
          batch.map((p) => p.item),
          claim,
        );
        batch.forEach((p, i) => p.done(results[i] ?? new Error("finish answered no item")));
      }
    } finally {
      this.sending = false;
    }
  }

  private async send(items: FinishItem[], claim: Record<string, unknown> | null): Promise<(FinishResult | Error)[]> {
    try {
      const sent = now();
      // A claim whose answer is lost (and so sent again) leaves its leases
      // to be reaped after their TTL, as a lost claim's would.
      const body = claim === null ? { items } : { items, claim };
      const answer = await this.api.postRetrying<FinishAnswer>("/v1/finish", body, FINISH_TIMEOUT_MS);
      // Started before the items answer, so the new jobs hold their slots
      // before the finished ones give theirs back to the claim loop.
      if (answer.leases !== undefined) this.rider.start(answer.leases, sent, now());
      if (answer.items.length !== items.length) {
        const e = new Error(`finish answered ${answer.items.length} items for ${items.length}`);
        return items.map(() => e);
      }
      return answer.items;
    } catch (e) {
      if (e instanceof ApiError && [400, 413, 422].includes(e.status) && items.length > 1) {
        // One item the coordinator refuses must not take the others down:
        // send each alone (claiming nothing: the slots go back to the claim
        // loop), so only it fails.
        const results: (FinishResult | Error)[] = [];
        for (const item of items) results.push(...(await this.send([item], null)));
        return results;
      }
      const error = e instanceof Error ? e : new Error(String(e));
      return items.map(() => error);
    }
  }
}

// ---------------------------------------------------------------------------
// The worker
// ---------------------------------------------------------------------------

/** A handler that was stopped gets this long to return before its outcome is decided without it. */
const STOP_GRACE_MS = 1_000;
/** How often the heartbeat loop looks when it knows no interval yet. */
const FALLBACK_HEARTBEAT_MS = 1_000;

interface Options {
  queues: string[];
  workerId: string;
  concurrency: number;
  waitMs: number;
  graceMs: number;
}

type Ended = { kind: "result"; value: unknown } | { kind: "error"; error: unknown } | { kind: "hung" };

type Outcome = { action: "drop"; reason: StopReason } | FinishItem;

/** What is logged once an outcome landed. */
const FINISHED = { complete: "job completed", fail: "job failed", release: "job released" } as const;

class Worker {
  /** Lease token → job, from its claim until its outcome is answered (or it is dropped). */
  private readonly held = new Map<string, Job>();
  /** Every job's run, from claim to answered outcome. */
  private readonly runs = new Set<Promise<void>>();
  private readonly finisher: Finisher;
  /** Aborts at the first SIGTERM or SIGINT, or when claims are refused. */
  readonly shutdown = new AbortController();
  /** Aborts at a second signal: no more grace. */
  readonly hurry = new AbortController();
  private readonly stopHeartbeats = new AbortController();
  private readonly slotFreed = new Notify();
  private readonly leaseAdded = new Notify();
  exitCode = 0;

  constructor(
    private readonly api: Coordinator,
    private readonly options: Options,
  ) {
    this.finisher = new Finisher(api, {
      claim: (slots) =>
        slots === 0 || this.shutdown.signal.aborted
          ? null
          : { queues: options.queues, worker_id: options.workerId, max_jobs: slots, wait_ms: 0 },
      start: (leases, sent, received) => this.startLeases(leases, sent, received, "finish"),
    });
  }

  async run(): Promise<number> {
    log("worker started", {
      worker_id: this.options.workerId,
      queues: this.options.queues,
      url: this.api.url,
    });
    const heartbeats = this.heartbeatLoop();
    await this.claimLoop();
    await this.drain();
    this.stopHeartbeats.abort();
    await heartbeats;
    log("worker stopped");
    return this.exitCode;
  }

  // ---- claiming ----

  private async claimLoop(): Promise<void> {
    const { queues, workerId, concurrency, waitMs } = this.options;
    let backoff = 200;
    while (!this.shutdown.signal.aborted) {
      const slots = concurrency - this.held.size;
      if (slots <= 0) {
        await race([this.slotFreed.wait()], this.shutdown.signal);
        continue;
      }
      const body = { queues, worker_id: workerId, max_jobs: slots, wait_ms: waitMs };
      const sent = now();
      let leases: Lease[];
      try {
        // Not retried blindly: leases of a claim whose answer was lost are
        // reaped after their TTL. A parked claim is let answer even at
        // shutdown; what it brings is released below.
        leases = (await this.api.post<ClaimAnswer>("/v1/claim", body, waitMs + 30_000)).leases;
        backoff = 200;
      } catch (e) {
        if (e instanceof ApiError && e.status < 500) {
          // A wrong key, role or queue name: retrying cannot help.
          log("claim refused; stopping", { error: String(e) });
          this.exitCode = 1;
          this.shutdown.abort();
          break;
        }
        const wait = e instanceof ApiError && e.retryAfterMs !== null ? e.retryAfterMs : jitter(backoff);
        log(e instanceof ApiError ? "claim failed; retrying" : "coordinator unreachable; retrying", {
          error: describe(e),
        });
        await delay(wait, this.shutdown.signal);
        backoff = Math.min(backoff * 2, 5_000);
        continue;
      }
      this.startLeases(leases, sent, now(), "claim");
    }
  }

  /** Holds and runs the jobs of `leases` (given back at once when stopping). */
  private startLeases(leases: Lease[], sent: number, received: number, via: "claim" | "finish"): void {
    for (const lease of leases) {
      const job = new Job(lease, sent, received);
      this.held.set(job.leaseToken, job);
      this.track(this.shutdown.signal.aborted ? this.giveBack(job) : this.runJob(job, via));
    }
    if (leases.length > 0) this.leaseAdded.notify();
  }

  private track(run: Promise<void>): void {
    this.runs.add(run);
    void run.finally(() => this.runs.delete(run));
  }

  /** Claimed while we were stopping: give it back at once. */
  private async giveBack(job: Job): Promise<void> {
    log("job claimed", {
      job_id: job.jobId,
      run_lease: job.runLease,
      attempt: job.attempt,
      during: "shutdown",
    });
    await this.settle(job, { lease_token: job.leaseToken, action: "release" });
  }

  // ---- running one job ----

  private async runJob(job: Job, via: "claim" | "finish"): Promise<void> {
    log("job claimed", { job_id: job.jobId, run_lease: job.runLease, attempt: job.attempt, via });
    const handled: Promise<Ended> = handle(job).then(
      (value): Ended => ({ kind: "result", value }),
      (error: unknown): Ended => ({ kind: "error", error }),
    );
    // Once stopped, the handler gets STOP_GRACE_MS to return.
    const ended = await race([
      handled,
      (done: AbortSignal) =>
        aborted(job.signal, done)
          .then(() => delay(STOP_GRACE_MS, done))
          .then((): Ended => ({ kind: "hung" })),
    ]);
    await this.settle(job, outcomeOf(job, ended ?? { kind: "hung" }));
  }

  /** Sends the job's outcome (or drops it), then frees its slot. */
  private async settle(job: Job, outcome: Outcome): Promise<void> {
    job.settle();
    const ids = { job_id: job.jobId, run_lease: job.runLease };
    if (outcome.action === "drop") {
      // Someone else may hold the job now: whatever the handler did, nothing
      // is sent (it would be refused); the coordinator decides.
      log("job dropped", { ...ids, reason: outcome.reason });
    } else {
      // A job given back while stopping frees no slot worth claiming for.
      const result = await this.finisher.submit(outcome, !this.shutdown.signal.aborted);
      if (result instanceof Error) {
        log("finish failed", { ...ids, action: outcome.action, error: describe(result) });
      } else if (result.status === "lease_lost") {
        log("finish refused: lease lost", { ...ids, action: outcome.action, state: result.state });
      } else {
        log(FINISHED[outcome.action], { ...ids, state: result.state });
      }
    }
    this.held.delete(job.leaseToken);
    this.slotFreed.notify();
  }

  // ---- heartbeats ----

  /** One heartbeat request per interval for every held lease. */
  private async heartbeatLoop(): Promise<void> {
    const stop = this.stopHeartbeats.signal;
    let last = now();
    while (!stop.aborted) {
      if (this.held.size === 0) {
        await race([this.leaseAdded.wait()], stop);
        last = now();
        continue;
      }
      let interval = Infinity;
      for (const job of this.held.values()) interval = Math.min(interval, job.heartbeatIntervalMs);
      if (!Number.isFinite(interval)) interval = FALLBACK_HEARTBEAT_MS;
      const woke = await race(
        [
          (done: AbortSignal) => delay(last + interval - now(), done).then(() => "due" as const),
          // A new lease may ask for a shorter interval: look again.
          this.leaseAdded.wait().then(() => "added" as const),
        ],
        stop,
      );
      if (woke !== "due") continue;
      last = now();
      // Leases we gave up on are not renewed; the others are, until their
      // outcome is answered (a complete being retried keeps its lease).
      const jobs = [...this.held.values()].filter((job) => {
        job.fenceIfDue();
        return job.stopReason !== "lease_lost" && job.stopReason !== "no_heartbeat";
      });
      for (let i = 0; i < jobs.length; i += MAX_ITEMS_PER_REQUEST) {
        await this.heartbeat(jobs.slice(i, i + MAX_ITEMS_PER_REQUEST));
      }
    }
  }

  private async heartbeat(jobs: Job[]): Promise<void> {
    const carried = jobs.map((job) => job.takeCheckpoint());
    const items = jobs.map((job, i) => {
      const checkpoint = carried[i];
      return checkpoint
        ? { lease_token: job.leaseToken, progress: checkpoint.progress }
        : { lease_token: job.leaseToken };
    });
    // Short enough that a hung request does not hold up the next beat for long.
    const ttl = Math.min(...jobs.map((j) => j.leaseTtlMs));
    const timeoutMs = Math.min(10_000, Math.max(1_000, Math.round(ttl / 3)));
    const sent = now();
    let answer: HeartbeatAnswer;
    try {
      answer = await this.api.post<HeartbeatAnswer>("/v1/heartbeat", { leases: items }, timeoutMs);
    } catch (e) {
      if (e instanceof ApiError && e.status === 422 && items.some((i) => "progress" in i)) {
        // A checkpoint the coordinator cannot store (a NUL character): the
        // renewals matter more, so send them without checkpoints.
        log("heartbeat refused a checkpoint; renewing without", { error: String(e) });
        carried.fill(null);
        try {
          answer = await this.api.post<HeartbeatAnswer>(
            "/v1/heartbeat",
            { leases: jobs.map((j) => ({ lease_token: j.leaseToken })) },
            timeoutMs,
          );
        } catch (again) {
          log("heartbeat failed", { error: describe(again), leases: jobs.length });
          return;
        }
      } else {
        // Each lease's fence timer decides when this has gone on too long.
        log("heartbeat failed", { error: describe(e), leases: jobs.length });
        return;
      }
    }
    answer.leases.forEach((result, i) => {
      const job = jobs[i];
      if (job === undefined) return;
      if (result.status === "renewed" || result.status === "cancel_requested") {
        job.renewed(sent, carried[i] ?? null);
      }
      if (job.stopReason !== null || job.isSettled) return;
      if (result.status === "cancel_requested") {
        log("cancel requested", { job_id: job.jobId, run_lease: job.runLease });
        job.stop("cancel_requested");
      } else if (result.status === "lease_lost") {
        log("lease lost", { job_id: job.jobId, run_lease: job.runLease });
        job.stop("lease_lost");
      }
    });
  }

  // ---- shutdown ----

  /** Lets handlers finish for the grace period, then stops and releases the rest. */
  private async drain(): Promise<void> {
    log("draining", { held: this.held.size, grace_ms: this.options.graceMs });
    await race(
      [Promise.all([...this.runs]).then(() => {}), (done: AbortSignal) => delay(this.options.graceMs, done)],
      this.hurry.signal,
    );
    for (const job of this.held.values()) job.stop("shutdown");
    while (this.runs.size > 0) await Promise.all([...this.runs]);
  }
}

/** What to send for a job whose handler ended (or was given up on) this way. */
function outcomeOf(job: Job, ended: Ended): Outcome {
  const lease_token = job.leaseToken;
  const reason = job.stopReason;
  if (reason === "lease_lost" || reason === "no_heartbeat") return { action: "drop", reason };
  // A handler that returned anyway (a cancel or a shutdown came too late)
  // reports its result: a complete still lands as done.
  if (ended.kind === "result") return { lease_token, action: "complete", result: ended.value ?? null };
  if (reason === null && ended.kind === "error") {
    const e = ended.error;
    if (e instanceof JobFailed) {
      const item: FinishItem = { lease_token, action: "fail", error: e.message, retryable: e.retryable };
      if (e.retryAfterMs !== undefined) item.retry_after_ms = e.retryAfterMs;
      return item;
    }
    // Any other handler error fails the attempt, to be retried.
    return { lease_token, action: "fail", error: describe(e), retryable: true };
  }
  // The handler stopped (or failed, or did not return) because we asked it
  // to: the reason decides what is sent.
  switch (reason) {
    case "cancel_requested":
      return {
        lease_token,
        action: "fail",
        error: "cancel requested; the handler stopped",
        retryable: false,
      };
    case "timeout":
      return { lease_token, action: "fail", error: "the attempt passed its timeout_ms", retryable: true };
    default: {
      // Shutdown: give the job back with its checkpoint, no attempt charged.
      const release: FinishItem = { lease_token, action: "release" };
      if (job.progress !== null && job.progress !== undefined) release.progress = job.progress;
      return release;
    }
  }
}

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/** Monotonic milliseconds. */
function now(): number {
  return performance.now();
}

/** Somewhere in [ms / 2, ms): workers that failed together do not retry together. */
function jitter(ms: number): number {
  return ms / 2 + (Math.random() * ms) / 2;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function describe(e: unknown): string {
  if (!(e instanceof Error)) return String(e);
  // fetch hides the transport error in `cause` ("fetch failed").
  const cause = e.cause instanceof Error ? `: ${e.cause.message}` : "";
  return e instanceof ApiError || e instanceof JobFailed ? e.message : `${e.name}: ${e.message}${cause}`;
}

/** Resolves after `ms`, or at once when `signal` aborts (never rejects). */
function delay(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    signal?.addEventListener("abort", done, { once: true });
  });
}

/**
 * Resolves with the first of `branches` to settle, or with `undefined` once
 * `stop` aborts. A branch given as a function gets a signal that aborts when
 * the race is over, to clear its timers and listeners.
 */
async function race<T>(
  branches: (Promise<T> | ((done: AbortSignal) => Promise<T>))[],
  stop?: AbortSignal,
): Promise<T | undefined> {
  const done = new AbortController();
  const racing: Promise<T | undefined>[] = branches.map((b) =>
    typeof b === "function" ? b(done.signal) : b,
  );
  if (stop) racing.push(aborted(stop, done.signal).then(() => undefined));
  try {
    return await Promise.race(racing);
  } finally {
    done.abort();
  }
}

/**
 * Resolves once `signal` aborts. If `forget` aborts first, it stays pending
 * for good and lets go of its listener.
 */
function aborted(signal: AbortSignal, forget?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      forget?.removeEventListener("abort", drop);
      resolve();
    };
    const drop = () => signal.removeEventListener("abort", done);
    signal.addEventListener("abort", done, { once: true });
    forget?.addEventListener("abort", drop, { once: true });
  });
}

/** Wakes everyone waiting when `notify` is called (one shared promise per round: waiting leaks nothing). */
class Notify {
  private round: { promise: Promise<void>; resolve: () => void } | null = null;

  wait(): Promise<void> {
    if (this.round === null) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      this.round = { promise, resolve };
    }
    return this.round.promise;
  }

  notify(): void {
    this.round?.resolve();
    this.round = null;
  }
}

/** One JSON line per event on standard error. */
function log(msg: string, fields: Record<string, unknown> = {}): void {
  process.stderr.write(JSON.stringify({ ts: Math.round(Date.now()) / 1000, msg, ...fields }) + "\n");
}

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

const USAGE = `usage: node dist/worker.js [--url URL] [--key KEY] [--queue QUEUE ...] [--worker-id ID]
                          [--concurrency N] [--wait-ms MS] [--grace-ms MS]

A runlease worker in TypeScript (Node's fetch only).

  --url URL          the coordinator (default RUNLEASE_URL or http://127.0.0.1:8080)
  --key KEY          a worker API key (default RUNLEASE_KEY)
  --queue QUEUE      a queue to claim from (repeatable; default RUNLEASE_QUEUES or 'default')
  --worker-id ID     default RUNLEASE_WORKER_ID or ts-<host>-<pid>
  --concurrency N    jobs held at once (default 4)
  --wait-ms MS       claim long-poll, 0..60000 (default 10000)
  --grace-ms MS      on SIGTERM, how long running handlers may go on before they
                     are stopped and released (default 10000)`;

function main(): void {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        url: { type: "string" },
        key: { type: "string" },
        queue: { type: "string", multiple: true },
        "worker-id": { type: "string" },
        concurrency: { type: "string" },
        "wait-ms": { type: "string" },
        "grace-ms": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
      allowPositionals: false,
    }));
  } catch (e) {
    process.stderr.write(`${USAGE}\n\nerror: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exit(2);
  }
  if (values.help) {
    process.stdout.write(`${USAGE}\n`);
    process.exit(0);
  }
  const integer = (name: string, text: string | undefined, fallback: number, min: number): number => {
    if (text === undefined) return fallback;
    const n = Number(text);
    if (!Number.isInteger(n) || n < min) {
      process.stderr.write(
        `${USAGE}\n\nerror: --${name} must be an integer of at least ${min}, not ${JSON.stringify(text)}\n`,
      );
      process.exit(2);
    }
    return n;
  };
  const env = process.env;
  const queues = (values.queue ?? (env["RUNLEASE_QUEUES"] ?? "default").split(","))
    .map((q) => q.trim())
    .filter((q) => q.length > 0);
  const worker = new Worker(
    new Coordinator(
      values.url ?? env["RUNLEASE_URL"] ?? "http://127.0.0.1:8080",
      values.key ?? env["RUNLEASE_KEY"],
    ),
    {
      queues,
      workerId: values["worker-id"] ?? env["RUNLEASE_WORKER_ID"] ?? `ts-${hostname()}-${process.pid}`,
      concurrency: integer("concurrency", values.concurrency, 4, 1),
      waitMs: integer("wait-ms", values["wait-ms"], 10_000, 0),
      graceMs: integer("grace-ms", values["grace-ms"], 10_000, 0),
    },
  );

  const onSignal = (signal: NodeJS.Signals) => {
    if (!worker.shutdown.signal.aborted) {
      log("signal received; stopping", { signal });
      worker.shutdown.abort();
    } else {
      log("signal received again; stopping handlers now", { signal });
      worker.hurry.abort();
    }
  };
  process.on("SIGTERM", onSignal);
  process.on("SIGINT", onSignal);

  worker.run().then(
    (code) => process.exit(code),
    (e: unknown) => {
      log("worker crashed", { error: e instanceof Error ? (e.stack ?? e.message) : String(e) });
      process.exit(70);
    },
  );
}

main();
