/**
 * runlease: a pull worker, a push handler for endpoint-served queues, and a
 * producer, over Web-standard APIs only (`fetch`, `crypto.subtle`,
 * `AbortSignal`, `TextEncoder`).
 */
export { RunleaseError, JobError, RetryLater, LeaseAborted, type ErrorCode, type AbortReason, type JobErrorOptions } from "./errors.js";
export type { ConnectionOptions } from "./http.js";
export { Release, type JobContext } from "./lease.js";
export { Producer, type EnqueueRequest, type WaitOptions } from "./producer.js";
export { pushHandler, type PushHandlerOptions, type PushRequestOptions, type PushBody } from "./push.js";
export { verify as verifySignature, sign as signPayload } from "./signature.js";
export { Worker, type Handler, type WorkerEvent, type WorkerOptions } from "./worker.js";
export type { Attempt, Dependency, FinishAnswer, FinishItem, Job, JobState, Json, Lease } from "./types.js";
