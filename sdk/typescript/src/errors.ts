/** The error codes the coordinator answers (`{"error": {"code", "message"}}`). */
export type ErrorCode =
  | "bad_request"
  | "invalid"
  | "unauthorized"
  | "forbidden"
  | "not_found"
  | "method_not_allowed"
  | "lease_lost"
  | "conflict"
  | "too_large"
  | "overloaded"
  | "internal"
  /** No answer: the connection failed, or the answer was not JSON. */
  | "unreachable";

/** An error answer of the coordinator, or no answer at all (`code: "unreachable"`). */
export class RunleaseError extends Error {
  override readonly name = "RunleaseError";
  /** The coordinator's error code, or `unreachable`. */
  readonly code: ErrorCode;
  /** The HTTP status, or 0 when there was no answer. */
  readonly status: number;
  /** `Retry-After` of a 429/503 answer, in milliseconds. */
  readonly retryAfterMs: number | undefined;

  constructor(code: ErrorCode, message: string, status: number, retryAfterMs?: number, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.code = code;
    this.status = status;
    this.retryAfterMs = retryAfterMs;
  }

  /** True when repeating the same request later may succeed (no answer, 429, 503). */
  get transient(): boolean {
    return this.code === "unreachable" || this.status === 429 || this.status === 503 || this.status >= 500;
  }
}

/** Options of a handler's failure. */
export interface JobErrorOptions {
  /** False fails the job at once; true (the default) retries it while its budget lasts. */
  retryable?: boolean;
  /** Retry after this long instead of the coordinator's backoff. */
  retryAfterMs?: number;
}

/** Thrown by a handler to fail its attempt with a choice of retry. Any other thrown error fails it retryably. */
export class JobError extends Error {
  override readonly name = "JobError";
  readonly retryable: boolean;
  readonly retryAfterMs: number | undefined;

  constructor(message: string, options: JobErrorOptions = {}) {
    super(message);
    this.retryable = options.retryable ?? true;
    this.retryAfterMs = options.retryAfterMs;
  }
}

/**
 * Thrown by a handler that cannot run the job now: a push answers 503 with
 * `Retry-After` (the attempt is not charged); a pull worker fails the attempt
 * retryably, due again after `retryAfterMs`.
 */
export class RetryLater extends Error {
  override readonly name = "RetryLater";
  readonly retryAfterMs: number;

  constructor(retryAfterMs: number, message = "not now") {
    super(message);
    this.retryAfterMs = retryAfterMs;
  }
}

/** Why a handler's `AbortSignal` fired. */
export type AbortReason = "lease_lost" | "cancel_requested" | "unreachable" | "shutdown";

/** The `reason` of a handler's aborted signal. */
export class LeaseAborted extends Error {
  override readonly name = "LeaseAborted";
  readonly reason: AbortReason;

  constructor(reason: AbortReason) {
    super(
      {
        lease_lost: "the lease was lost: another attempt owns the job now; stop and drop it",
        cancel_requested: "a cancel was requested: stop the job",
        unreachable: "the coordinator was unreachable for a whole lease TTL: the lease is given up",
        shutdown: "the worker is shutting down: the job will be released",
      }[reason],
    );
    this.reason = reason;
  }
}
