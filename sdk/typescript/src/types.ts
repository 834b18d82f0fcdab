/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** A job's state. */
export type JobState = "queued" | "running" | "done" | "failed" | "cancelled" | "enqueue_failed" | "blocked";

/** One entry of a job's attempt chronology. */
export interface Attempt {
  run_lease: number;
  worker_id: string;
  claimed_at: string;
  finished_at: string | null;
  outcome: "completed" | "failed" | "released" | "lease_expired" | "cancelled" | null;
  error: string | null;
}

/** A job as the coordinator answers it. */
export interface Job {
  id: string;
  queue: string;
  state: JobState;
  payload: unknown;
  priority: number;
  attempt: number;
  max_attempts: number;
  run_lease: number;
  run_at: string;
  created_at: string;
  updated_at: string;
  finished_at: string | null;
  timeout_ms: number | null;
  idempotency_key: string | null;
  concurrency_key: string | null;
  progress: unknown;
  result: unknown;
  error: string | null;
  cancel_requested: boolean;
  traceparent?: string;
  attempts?: Attempt[];
}

/** A lease as a claim answers it. */
export interface Lease {
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
  traceparent?: string;
  /** Present when the job was enqueued with dependencies: each one's id, state and result. */
  dependencies?: Dependency[];
}

/** A dependency of a leased job, as the coordinator saw it when it handed out the lease. */
export interface Dependency {
  id: string;
  /** Null when the dependency was deleted. */
  state: JobState | null;
  result: unknown;
}

/** One finishing outcome, as `/v1/finish` takes it. */
export type FinishItem =
  | { lease_token: string; action: "complete"; result: unknown }
  | { lease_token: string; action: "fail"; error: string; retryable: boolean; retry_after_ms?: number }
  | { lease_token: string; action: "release"; progress?: unknown };

/** One answered item of `/v1/finish`. */
export interface FinishAnswer {
  job_id: string;
  run_lease: number;
  status: "ok" | "lease_lost";
  state: JobState | null;
}
