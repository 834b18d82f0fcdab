// The JSON API as the page calls it: same origin, the key as a bearer
// token, every non-2xx answer turned into an ApiError carrying the
// protocol's error code and message.

const KEY_SLOT = "runlease.key";

/** An answer of the coordinator that is not 2xx (or no answer at all). */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

/** The key of this tab (session storage: gone when the tab closes). */
export function storedKey() {
  return sessionStorage.getItem(KEY_SLOT);
}

export function storeKey(key) {
  if (key) sessionStorage.setItem(KEY_SLOT, key);
  else sessionStorage.removeItem(KEY_SLOT);
}

/** Server time minus this browser's time, from the answers' Date headers. */
let skewMs = 0;

/** Now, by the coordinator's clock (to a second), in ms since the epoch. */
export function serverNow() {
  return Date.now() + skewMs;
}

async function call(method, path, body) {
  const headers = { Accept: "application/json" };
  const key = storedKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
    });
  } catch (e) {
    throw new ApiError(0, "unreachable", `the coordinator did not answer (${e.message})`);
  }
  const date = Date.parse(response.headers.get("Date") || "");
  if (!Number.isNaN(date)) skewMs = date + 500 - Date.now();
  const text = await response.text();
  let data = null;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!response.ok) {
    const err = data && data.error;
    throw new ApiError(
      response.status,
      err ? err.code : "http_" + response.status,
      err ? err.message : `the coordinator answered ${response.status}`,
    );
  }
  return data;
}

const enc = encodeURIComponent;

export const api = {
  whoami: () => call("GET", "/v1/whoami"),
  queues: () => call("GET", "/v1/queues"),
  queue: (q) => call("GET", `/v1/queues/${enc(q)}`),
  updateQueue: (q, change) => call("PATCH", `/v1/queues/${enc(q)}`, change),
  jobs: (q, states, cursor, limit) => {
    const params = new URLSearchParams({ queue: q, limit: String(limit) });
    if (states.length) params.set("state", states.join(","));
    if (cursor) params.set("cursor", cursor);
    return call("GET", `/v1/jobs?${params}`);
  },
  job: (id) => call("GET", `/v1/jobs/${enc(id)}`),
  cancel: (id) => call("POST", `/v1/jobs/${enc(id)}/cancel`),
  retry: (id) => call("POST", `/v1/jobs/${enc(id)}/retry`),
  bulk: (req) => call("POST", "/v1/jobs/bulk", req),
  schedules: () => call("GET", "/v1/schedules"),
};
