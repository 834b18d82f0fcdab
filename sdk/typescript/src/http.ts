import { RunleaseError, type ErrorCode } from "./errors.js";

/** How the library reaches a coordinator. */
export interface ConnectionOptions {
  /** The coordinator's base URL, e.g. `https://runlease.example.com`. */
  url: string;
  /** An API key (`Authorization: Bearer`); omit in open mode. */
  key?: string;
  /** A `fetch` to use instead of the global one (tests, proxies). */
  fetch?: typeof fetch;
}

/** One JSON-over-HTTP caller of the coordinator. */
export class Transport {
  readonly url: string;
  readonly #key: string | undefined;
  readonly #fetch: typeof fetch;

  constructor(options: ConnectionOptions) {
    this.url = options.url.replace(/\/+$/, "");
    this.#key = options.key;
    this.#fetch = options.fetch ?? ((input, init) => globalThis.fetch(input, init));
  }

  /** Sends `body` (when given) and answers the parsed JSON, or throws a `RunleaseError`. */
  async request<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const headers: Record<string, string> = { accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (this.#key !== undefined) headers["authorization"] = `Bearer ${this.#key}`;
    let response: Response;
    try {
      response = await this.#fetch(this.url + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
    } catch (e) {
      throw new RunleaseError("unreachable", `${method} ${path}: no answer from the coordinator: ${String(e)}`, 0, undefined, e);
    }
    const text = await response.text().catch((e: unknown) => {
      throw new RunleaseError("unreachable", `${method} ${path}: the answer broke off: ${String(e)}`, 0, undefined, e);
    });
    let json: unknown = null;
    try {
      json = text === "" ? null : JSON.parse(text);
    } catch {
      if (response.ok) throw new RunleaseError("unreachable", `${method} ${path}: the answer is not JSON`, response.status);
    }
    if (response.ok) return json as T;
    const retryAfter = Number(response.headers.get("retry-after"));
    const error = (json as { error?: { code?: string; message?: string } } | null)?.error;
    throw new RunleaseError(
      (error?.code ?? (response.status >= 500 ? "internal" : "bad_request")) as ErrorCode,
      error?.message ?? `${method} ${path} answered ${response.status}: ${text.slice(0, 200)}`,
      response.status,
      Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter * 1000 : undefined,
    );
  }
}

/** Resolves after `ms`, or at once when `signal` fires. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}
