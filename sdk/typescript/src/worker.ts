import { RunleaseError } from "./errors.js";
import { sleep, Transport, type ConnectionOptions } from "./http.js";
import { finishWithRetry, Heartbeater, HeldLease, outcomeOf, type JobContext } from "./lease.js";
import type { AbortReason } from "./errors.js";
import type { FinishAnswer, FinishItem, Lease } from "./types.js";

/** What happened to a lease, for logs and metrics (`onEvent`). */
export type WorkerEvent =
  /** A lease was handed out; `withOutcomes` when its claim rode a finish that carried outcomes. */
  | { type: "claimed"; lease: Lease; withOutcomes: boolean }
  /** The handler's signal fired. */
  | { type: "aborted"; jobId: string; runLease: number; reason: AbortReason }
  /** An outcome was answered: `ok` (applied, or a receipt of a repeat) or `lease_lost`. */
  | { type: "finished"; jobId: string; runLease: number; action: FinishItem["action"]; status: "ok" | "lease_lost" }
  /** Nothing is sent for this lease (lost, or a whole TTL without an answer). */
  | { type: "dropped"; jobId: string; runLease: number; reason: "lease_lost" | "unreachable" };

/** A job handler: its return value is the job's result (or `ctx.release(...)`); a throw fails the attempt. */
export type Handler<P = unknown> = (job: JobContext<P>) => unknown;

/** Settings of a pull worker. */
export interface WorkerOptions<P = unknown> extends ConnectionOptions {
  /** The queues to claim from (1 to 100). */
  queues: string[];
  handler: Handler<P>;
  /** Recorded on each attempt and inside its lease token (default `ts-<random>`). */
  workerId?: string;
  /** Handlers running at once (default 1). */
  concurrency?: number;
  /** How long a claim parks when nothing is claimable (default 20 s, at most 60 s). */
  waitMs?: number;
  /**
   * The platform's remaining run time (a Lambda's `getRemainingTimeInMillis`):
   * claims carry it as `time_left_ms`, so only jobs whose timeout fits are
   * handed out; once it falls to `deadlineMarginMs` the worker drains at once
   * (stops claiming and releases what it holds).
   */
  timeLeftMs?: () => number;
  /** Default 2 s. */
  deadlineMarginMs?: number;
  /** How long `stop()` lets running handlers finish before aborting them (`shutdown`) and releasing their jobs (default 30 s). */
  drainTimeoutMs?: number;
  /** Told of every error the worker recovers from by itself (network, 503). */
  onError?: (error: unknown) => void;
  /** Told of each lease's claim, abort and outcome. */
  onEvent?: (event: WorkerEvent) => void;
}

/**
 * A pull worker: claims with long-polls, runs up to `concurrency` handlers,
 * heartbeats their leases in the background, and sends each outcome with the
 * next claim (`POST /v1/finish` with `claim`).
 */
export class Worker<P = unknown> {
  readonly workerId: string;
  readonly #o: Required<Pick<WorkerOptions<P>, "concurrency" | "waitMs" | "drainTimeoutMs" | "deadlineMarginMs">> &
    WorkerOptions<P>;
  readonly #http: Transport;
  readonly #beats: Heartbeater;
  readonly #running = new Set<HeldLease>();
  readonly #handlers = new Set<Promise<void>>();
  readonly #flushes = new Set<Promise<void>>();
  #outcomes: { held: HeldLease; item: FinishItem }[] = [];
  #stopping = false;
  #drainTimeoutMs: number;
  #longPoll: AbortController | undefined;
  #notify: (() => void) | undefined;
  #stopSignal = new AbortController();
  #done: Promise<void> | undefined;
  #fatal: RunleaseError | undefined;

  constructor(options: WorkerOptions<P>) {
    this.#o = { concurrency: 1, waitMs: 20_000, drainTimeoutMs: 30_000, deadlineMarginMs: 2_000, ...options };
    if (!(this.#o.concurrency >= 1)) throw new RangeError("concurrency must be at least 1");
    this.workerId = options.workerId ?? `ts-${crypto.randomUUID().slice(0, 8)}`;
    this.#http = new Transport(options);
    this.#beats = new Heartbeater(this.#http, (e) => this.#error(e));
    this.#drainTimeoutMs = this.#o.drainTimeoutMs;
  }

  /**
   * Runs until `stop()` (or the deadline of `timeLeftMs`) has drained the
   * worker. It rejects with the `RunleaseError` after draining when the
   * coordinator refuses the claim itself (401, 403, 4xx: a wrong key or
   * queue will not heal by retrying). Calling it twice answers the same run.
   */
  run(): Promise<void> {
    this.#done ??= this.#loop();
    return this.#done;
  }

  /**
   * Drains: stops claiming, lets running handlers finish for up to
   * `timeoutMs` (default `drainTimeoutMs`), then aborts the rest with reason
   * `shutdown` and releases their jobs; sends every outcome; resolves when
   * the worker holds nothing. `stop({timeoutMs: 0})` during a drain (a
   * second signal) aborts the running handlers at once.
   */
  async stop(options: { timeoutMs?: number } = {}): Promise<void> {
    if (options.timeoutMs !== undefined) this.#drainTimeoutMs = options.timeoutMs;
    if (this.#stopping && options.timeoutMs === 0) {
      for (const held of this.#running) held.abort("shutdown");
    }
    this.#stopping = true;
    this.#stopSignal.abort();
    this.#longPoll?.abort();
    this.#wake();
    await this.run();
  }

  #error(e: unknown): void {
    this.#o.onError?.(e);
  }

  #wake(): void {
    const notify = this.#notify;
    this.#notify = undefined;
    notify?.();
  }

  #timeLeft(): number | undefined {
    return this.#o.timeLeftMs?.();
  }

  async #loop(): Promise<void> {
    const deadline = this.#o.timeLeftMs === undefined ? undefined : setInterval(() => this.#checkDeadline(), 100);
    try {
      while (!this.#stopping) {
        this.#checkDeadline();
        if (!this.#stopping) await this.#cycle();
      }
    } finally {
      if (deadline !== undefined) clearInterval(deadline);
    }
    await this.#drain();
    if (this.#fatal !== undefined) throw this.#fatal;
  }

  #checkDeadline(): void {
    const left = this.#timeLeft();
    if (left !== undefined && left <= this.#o.deadlineMarginMs && !this.#stopping) {
      void this.stop({ timeoutMs: 0 });
    }
  }

  /** One request: the outcomes gathered so far, and a claim for the free slots. */
  async #cycle(): Promise<void> {
    const free = this.#o.concurrency - this.#running.size;
    if (free <= 0) {
      if (this.#outcomes.length > 0) {
        await this.#flush(this.#take());
        return;
      }
      await new Promise<void>((resolve) => (this.#notify = resolve));
      return;
    }
    const items = this.#take();
    const left = this.#timeLeft();
    const claim: Record<string, unknown> = {
      queues: this.#o.queues,
      worker_id: this.workerId,
      max_jobs: free,
      // Outcomes are answered after the claim's park: keep it short when they ride along.
      wait_ms: items.length > 0 ? 0 : Math.min(this.#o.waitMs, 60_000),
    };
    if (left !== undefined) claim["time_left_ms"] = Math.max(0, Math.floor(left - this.#o.deadlineMarginMs));
    const poll = items.length === 0 ? new AbortController() : undefined;
    this.#longPoll = poll;
    try {
      const answer = await this.#http.request<{ items?: FinishAnswer[]; leases: Lease[] }>(
        "POST",
        "/v1/finish",
        { items: items.map((i) => i.item), claim },
        poll?.signal,
      );
      this.#answered(items, answer.items ?? []);
      for (const lease of answer.leases) {
        this.#event({ type: "claimed", lease, withOutcomes: items.length > 0 });
        this.#start(lease);
      }
    } catch (e) {
      if (items.length > 0) await this.#flush(items);
      if (this.#stopping) return;
      if (e instanceof RunleaseError && !e.transient) {
        // The claim itself is refused (a wrong key or queue): retrying will not help.
        this.#fatal = e;
        this.#stopping = true;
        return;
      }
      this.#error(e);
      const retryAfter = e instanceof RunleaseError ? (e.retryAfterMs ?? 1000) : 1000;
      await sleep(retryAfter, this.#stopSignal.signal);
    } finally {
      this.#longPoll = undefined;
    }
  }

  #take(): { held: HeldLease; item: FinishItem }[] {
    const items = this.#outcomes;
    this.#outcomes = [];
    return items;
  }

  #event(event: WorkerEvent): void {
    this.#o.onEvent?.(event);
  }

  #answered(items: { held: HeldLease; item: FinishItem }[], answers: FinishAnswer[]): void {
    answers.forEach((a, i) => {
      const sent = items[i];
      if (sent === undefined) return;
      sent.held.stopClock();
      this.#event({ type: "finished", jobId: a.job_id, runLease: a.run_lease, action: sent.item.action, status: a.status });
    });
  }

  /** Sends outcomes alone (no claim), retrying a lost answer. */
  async #flush(items: { held: HeldLease; item: FinishItem }[]): Promise<void> {
    try {
      this.#answered(items, await finishWithRetry(this.#http, items, (e) => this.#error(e)));
    } catch (e) {
      this.#error(e);
    }
  }

  #start(lease: Lease): void {
    const held = new HeldLease(lease);
    held.controller.signal.addEventListener("abort", () => {
      const reason = held.abortReason;
      if (reason === undefined) return;
      this.#event({ type: "aborted", jobId: lease.job_id, runLease: lease.run_lease, reason });
      if (reason === "lease_lost" || reason === "unreachable") {
        this.#event({ type: "dropped", jobId: lease.job_id, runLease: lease.run_lease, reason });
      }
    });
    if (this.#stopping) {
      // A parked claim answered while draining: give the job back at once, no attempt charged.
      this.#outcomes.push({ held, item: { lease_token: lease.lease_token, action: "release" } });
      return;
    }
    this.#running.add(held);
    this.#beats.add(held);
    const run = (async () => {
      let settled: { ok: true; value: unknown } | { ok: false; error: unknown };
      try {
        settled = { ok: true, value: await this.#o.handler(held.context() as JobContext<P>) };
      } catch (error) {
        settled = { ok: false, error };
      }
      this.#beats.remove(held);
      this.#running.delete(held);
      const item = outcomeOf(held, settled);
      if (item === null) {
        held.fence();
      } else if (this.#longPoll !== undefined) {
        // The loop is parked in a claim: send the outcome now rather than after the park.
        const flush = this.#flush([{ held, item }]);
        this.#flushes.add(flush);
        void flush.finally(() => this.#flushes.delete(flush));
      } else {
        this.#outcomes.push({ held, item });
      }
      this.#wake();
    })();
    this.#handlers.add(run);
    void run.finally(() => this.#handlers.delete(run));
  }

  async #drain(): Promise<void> {
    if (this.#handlers.size > 0) {
      const all = Promise.all([...this.#handlers]);
      const settled = new AbortController();
      void all.then(() => settled.abort());
      await sleep(this.#drainTimeoutMs, settled.signal);
      if (!settled.signal.aborted) {
        for (const held of this.#running) held.abort("shutdown");
        await Promise.all([...this.#handlers]);
      }
    }
    await Promise.all([...this.#flushes]);
    await this.#flush(this.#take());
    await this.#beats.stop();
  }
}
