import { Transport, type ConnectionOptions } from "./http.js";
import type { Job } from "./types.js";

/** What `enqueue` takes; `queue` and `payload` are required. */
export interface EnqueueRequest {
  queue: string;
  payload: unknown;
  priority?: number;
  run_at?: string;
  delay_ms?: number;
  max_attempts?: number;
  timeout_ms?: number;
  idempotency_key?: string;
  concurrency_key?: string;
  /** A local name other jobs of the same batch may depend on. */
  ref?: string;
  /** Refs of earlier jobs of the batch, or ids of existing jobs. */
  depends_on?: string[];
  on_dependency_failure?: "cancel" | "run";
  [field: string]: unknown;
}

/** Options of `waitForResult`. */
export interface WaitOptions {
  /** Give up after this long (default 60 s); the job is answered as it is then. */
  timeoutMs?: number;
  signal?: AbortSignal;
}

/** The producer API: enqueue jobs, read them, wait for their results, cancel and retry them. */
export class Producer {
  readonly #http: Transport;

  constructor(options: ConnectionOptions) {
    this.#http = new Transport(options);
  }

  /** `POST /v1/jobs`: the job as enqueued (or the original one for a repeated idempotency key). */
  enqueue(job: EnqueueRequest): Promise<Job> {
    return this.#http.request<Job>("POST", "/v1/jobs", job);
  }

  /** `POST /v1/jobs/batch`: 1 to 1000 jobs in one transaction, answered in the same order. */
  async enqueueBatch(jobs: EnqueueRequest[]): Promise<Job[]> {
    const answer = await this.#http.request<{ jobs: Job[] }>("POST", "/v1/jobs/batch", { jobs });
    return answer.jobs;
  }

  /** `GET /v1/jobs/{id}`: the job with its attempt chronology. */
  getJob(id: string, signal?: AbortSignal): Promise<Job> {
    return this.#http.request<Job>("GET", `/v1/jobs/${encodeURIComponent(id)}`, undefined, signal);
  }

  /**
   * Long-polls `GET /v1/jobs/{id}?wait_ms=` until the job is terminal or
   * `timeoutMs` passed, and answers the job as it is then (check its `state`).
   */
  async waitForResult(id: string, options: WaitOptions = {}): Promise<Job> {
    const deadline = Date.now() + (options.timeoutMs ?? 60_000);
    for (;;) {
      const left = Math.max(0, Math.min(30_000, deadline - Date.now()));
      const job = await this.#http.request<Job>(
        "GET",
        `/v1/jobs/${encodeURIComponent(id)}?wait_ms=${left}`,
        undefined,
        options.signal,
      );
      if (job.state === "done" || job.state === "failed" || job.state === "cancelled") return job;
      if (Date.now() >= deadline || options.signal?.aborted) return job;
    }
  }

  /** `POST /v1/jobs/{id}/cancel`: a running job stays running with `cancel_requested` until its worker stops. */
  cancel(id: string): Promise<Job> {
    return this.#http.request<Job>("POST", `/v1/jobs/${encodeURIComponent(id)}/cancel`, {});
  }

  /** `POST /v1/jobs/{id}/retry` (admin): a failed or cancelled job back to queued. */
  retry(id: string): Promise<Job> {
    return this.#http.request<Job>("POST", `/v1/jobs/${encodeURIComponent(id)}/retry`, {});
  }
}
