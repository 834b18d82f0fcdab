// The job handler the SDK examples share: the same queue as the examples
// beside it. `{name}` is a short job (answered with its result); `{pages,
// page_ms}` a long one (a page at a time, each saved as a checkpoint, so a
// later attempt resumes where this one stopped). A handler only returns or
// throws: the library verifies the push, answers the coordinator, and after
// a hand-off heartbeats the lease and finishes the job through /v1/*.
import { JobError, type JobContext } from "runlease";

export type Payload = { name?: unknown; pages?: unknown; page_ms?: unknown; fail?: unknown };

export async function run(ctx: JobContext<Payload>): Promise<unknown> {
  const p = ctx.payload;
  // Any other error fails the attempt and is retried while attempts last.
  if (typeof p.fail === "string") throw new Error(p.fail);
  if (p.pages === undefined) {
    // Never retried: the job fails at once (500 with runlease-no-retry).
    if (typeof p.name !== "string") throw new JobError("payload.name must be a string", { retryable: false });
    return { greeting: `hello, ${p.name}` };
  }
  const pages = count(p.pages, "pages");
  const pageMs = count(p.page_ms ?? 1000, "page_ms");
  for (let page = (ctx.progress as { page?: number } | null)?.page ?? 0; page < pages; page++) {
    await sleep(pageMs, ctx.signal); // render one page; stops on a cancel or a lost lease
    ctx.checkpoint({ page: page + 1 });
  }
  return { pages };
}

function count(v: unknown, what: string): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > 10_000) {
    throw new JobError(`payload.${what} must be a whole number from 0 to 10000`, { retryable: false });
  }
  return v;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => (clearTimeout(timer), reject(signal.reason)), { once: true });
  });
}
