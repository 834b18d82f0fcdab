import { LeaseAborted, RunleaseError, type AbortReason } from "./errors.js";
import { sleep, type Transport } from "./http.js";
import type { Dependency, FinishAnswer, FinishItem, Lease } from "./types.js";

/** Returned by `JobContext.release`: a handler that returns it releases its lease. */
export class Release {
  constructor(readonly progress: unknown) {}
}

/** What a handler gets for one attempt. */
export interface JobContext<P = unknown> {
  readonly id: string;
  /** With `id`, the fencing token: stamp `(id, runLease)` on side effects. */
  readonly runLease: number;
  readonly queue: string;
  readonly payload: P;
  readonly attempt: number;
  /** The checkpoint an earlier attempt saved, or null. */
  readonly progress: unknown;
  readonly traceparent: string | undefined;
  /** The jobs this one waited on (id, state, result), or an empty list. */
  readonly dependencies: readonly Dependency[];
  /**
   * Fires when the lease is lost, a cancel was requested, the coordinator was
   * unreachable for a whole lease TTL, or a drain ran out of time; its
   * `reason` is a `LeaseAborted`.
   */
  readonly signal: AbortSignal;
  /** Saves `progress` as the checkpoint; it rides the next heartbeat. */
  checkpoint(progress: unknown): void;
  /** `return ctx.release(progress)` gives the lease back (no attempt charged), keeping `progress` as the checkpoint. */
  release(progress?: unknown): Release;
}

/** One held lease: its heartbeat bookkeeping and its handler's abort controller. */
export class HeldLease {
  readonly controller = new AbortController();
  /** The checkpoint to send with the next heartbeat, if any. */
  pendingProgress: unknown = undefined;
  lastCheckpoint: unknown = undefined;
  /** Set once the lease is given up: nothing more is sent for it. */
  fenced = false;
  #fenceTimer: ReturnType<typeof setTimeout> | undefined;

  constructor(readonly lease: Lease) {}

  get token(): string {
    return this.lease.lease_token;
  }

  /** The abort reason, once the signal fired. */
  get abortReason(): AbortReason | undefined {
    const reason: unknown = this.controller.signal.reason;
    return reason instanceof LeaseAborted ? reason.reason : undefined;
  }

  /** Fires the handler's signal (once); a lost or unreachable lease is fenced. */
  abort(reason: AbortReason): void {
    if (reason === "lease_lost" || reason === "unreachable") this.fence();
    if (!this.controller.signal.aborted) this.controller.abort(new LeaseAborted(reason));
  }

  /** Renewed at `sentAt` (a request sent then was answered `renewed`): the lease is ours for another TTL from then. */
  renewed(sentAt: number): void {
    if (this.fenced) return;
    clearTimeout(this.#fenceTimer);
    const left = Math.max(0, sentAt + this.lease.lease_ttl_ms - Date.now());
    this.#fenceTimer = setTimeout(() => this.abort("unreachable"), left);
  }

  /** Sends nothing more for this lease. */
  fence(): void {
    this.fenced = true;
    clearTimeout(this.#fenceTimer);
  }

  /** Ends the fence clock without fencing (the lease was finished). */
  stopClock(): void {
    clearTimeout(this.#fenceTimer);
  }

  context(): JobContext {
    const lease = this.lease;
    return {
      id: lease.job_id,
      runLease: lease.run_lease,
      queue: lease.queue,
      payload: lease.payload,
      attempt: lease.attempt,
      progress: lease.progress,
      traceparent: lease.traceparent,
      dependencies: lease.dependencies ?? [],
      signal: this.controller.signal,
      checkpoint: (progress: unknown) => {
        this.pendingProgress = progress;
        this.lastCheckpoint = progress;
      },
      release: (progress?: unknown) => new Release(progress),
    };
  }
}

/** The outcome a handler's return or throw stands for, or null when nothing may be sent. */
export function outcomeOf(held: HeldLease, settled: { ok: true; value: unknown } | { ok: false; error: unknown }): FinishItem | null {
  const token = held.token;
  const reason = held.abortReason;
  if (held.fenced || reason === "lease_lost" || reason === "unreachable") return null;
  if (reason === "cancel_requested" || reason === "shutdown") {
    // A cancel is acknowledged by a release whatever the handler answered
    // (the job ends cancelled); a drain that ran out of time gives the job
    // back with its checkpoint.
    return { lease_token: token, action: "release", progress: held.lastCheckpoint };
  }
  if (settled.ok && settled.value instanceof Release) {
    return { lease_token: token, action: "release", progress: settled.value.progress ?? held.lastCheckpoint };
  }
  if (settled.ok) return { lease_token: token, action: "complete", result: settled.value ?? null };
  const error = settled.ok ? null : settled.error;
  const e = error as { name?: string; message?: string; retryable?: boolean; retryAfterMs?: number } | null;
  const message = e?.message ?? String(error);
  if (e?.name === "JobError") {
    const item: FinishItem = { lease_token: token, action: "fail", error: message, retryable: e.retryable !== false };
    if (e.retryAfterMs !== undefined) item.retry_after_ms = e.retryAfterMs;
    return item;
  }
  if (e?.name === "RetryLater") {
    return { lease_token: token, action: "fail", error: message, retryable: true, retry_after_ms: e.retryAfterMs ?? 0 };
  }
  return { lease_token: token, action: "fail", error: message, retryable: true };
}

/**
 * Heartbeats held leases in the background, one request for all of them,
 * every `heartbeat_interval_ms` of the leases; fires a handler's signal on
 * `lease_lost`, `cancel_requested`, or a whole TTL without a renewal.
 */
export class Heartbeater {
  readonly held = new Map<string, HeldLease>();
  readonly #http: Transport;
  readonly #stop = new AbortController();
  #loop: Promise<void> | undefined;
  #wake: (() => void) | undefined;

  constructor(http: Transport, readonly onError: (e: unknown) => void) {
    this.#http = http;
  }

  add(held: HeldLease): void {
    this.held.set(held.token, held);
    held.renewed(Date.now());
    this.#loop ??= this.#run();
    this.#wake?.();
  }

  remove(held: HeldLease): void {
    this.held.delete(held.token);
  }

  async stop(): Promise<void> {
    this.#stop.abort();
    this.#wake?.();
    await this.#loop;
  }

  async #run(): Promise<void> {
    const signal = this.#stop.signal;
    while (!signal.aborted) {
      const live = [...this.held.values()].filter((h) => !h.fenced);
      if (live.length === 0) {
        await new Promise<void>((resolve) => (this.#wake = resolve));
        this.#wake = undefined;
        continue;
      }
      const interval = Math.min(...live.map((h) => h.lease.heartbeat_interval_ms));
      await sleep(interval, signal);
      if (signal.aborted) return;
      await this.beat();
    }
  }

  /** One heartbeat of every live held lease. */
  async beat(): Promise<void> {
    const live = [...this.held.values()].filter((h) => !h.fenced);
    if (live.length === 0) return;
    const sentAt = Date.now();
    const sent = live.map((h) => {
      const progress = h.pendingProgress;
      h.pendingProgress = undefined;
      return { held: h, progress };
    });
    try {
      const answer = await this.#http.request<{ leases: { status: string }[] }>("POST", "/v1/heartbeat", {
        leases: sent.map(({ held, progress }) =>
          progress === undefined ? { lease_token: held.token } : { lease_token: held.token, progress },
        ),
      });
      answer.leases.forEach((item, i) => {
        const h = sent[i]?.held;
        if (h === undefined || h.fenced) return;
        if (item.status === "lease_lost") h.abort("lease_lost");
        else {
          h.renewed(sentAt);
          if (item.status === "cancel_requested") h.abort("cancel_requested");
        }
      });
    } catch (e) {
      // Unsent checkpoints go with the next heartbeat; the fence clock keeps running.
      for (const { held, progress } of sent) if (held.pendingProgress === undefined) held.pendingProgress = progress;
      this.onError(e);
    }
  }
}

/**
 * Sends finishing outcomes through `POST /v1/finish`, retrying a request whose
 * answer was lost (no answer, 5xx) with the same tokens: a repeat of an
 * applied outcome is answered `ok` as a receipt. An item whose lease went a
 * whole TTL without an answer is given up (self-fencing).
 */
export async function finishWithRetry(
  http: Transport,
  items: { held: HeldLease; item: FinishItem }[],
  onError: (e: unknown) => void,
): Promise<FinishAnswer[]> {
  let pending = items.filter(({ held }) => !held.fenced);
  let delay = 100;
  for (;;) {
    // A lease whose fence clock ran out (a whole TTL since its last renewal) is given up.
    pending = pending.filter(({ held }) => !held.fenced);
    if (pending.length === 0) return [];
    try {
      const answer = await http.request<{ items: FinishAnswer[] }>("POST", "/v1/finish", {
        items: pending.map((p) => p.item),
      });
      for (const p of pending) p.held.stopClock();
      return answer.items;
    } catch (e) {
      if (!(e instanceof RunleaseError) || !e.transient) throw e;
      onError(e);
    }
    await sleep(delay);
    delay = Math.min(delay * 2, 2000);
  }
}
