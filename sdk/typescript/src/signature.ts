/** Standard Webhooks signatures (HMAC-SHA256 over `id.timestamp.body`) with `crypto.subtle`. */

const encoder = new TextEncoder();

/** The raw key of a `whsec_<base64>` secret. */
export function secretBytes(secret: string): Uint8Array<ArrayBuffer> {
  const b64 = secret.startsWith("whsec_") ? secret.slice("whsec_".length) : secret;
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

function base64(bytes: Uint8Array): string {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}

/** `v1,<base64 HMAC-SHA256(key, id.timestamp.body)>`. */
export async function sign(secret: string, id: string, timestamp: string, body: Uint8Array): Promise<string> {
  const key = await crypto.subtle.importKey("raw", secretBytes(secret), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  const prefix = encoder.encode(`${id}.${timestamp}.`);
  const message = new Uint8Array(prefix.length + body.length);
  message.set(prefix, 0);
  message.set(body, prefix.length);
  return `v1,${base64(new Uint8Array(await crypto.subtle.sign("HMAC", key, message)))}`;
}

/** Compares two strings in time that depends only on their lengths. */
export function constantTimeEqual(a: string, b: string): boolean {
  const x = encoder.encode(a);
  const y = encoder.encode(b);
  let diff = x.length ^ y.length;
  for (let i = 0; i < Math.max(x.length, y.length); i++) diff |= (x[i] ?? 0) ^ (y[i] ?? 0);
  return diff === 0;
}

/** Why a request's signature was refused, or null when one of its signatures is valid for one of the secrets. */
export async function verify(
  secrets: string[],
  headers: Headers,
  body: Uint8Array,
  toleranceS: number,
  nowS: number,
): Promise<string | null> {
  const id = headers.get("webhook-id");
  const timestamp = headers.get("webhook-timestamp");
  const signatures = headers.get("webhook-signature");
  if (id === null || timestamp === null || signatures === null) {
    return "missing webhook-id, webhook-timestamp or webhook-signature header";
  }
  const ts = Number(timestamp);
  if (!/^\d+$/.test(timestamp) || !Number.isSafeInteger(ts)) return "webhook-timestamp is not unix seconds";
  if (ts < nowS - toleranceS) return "webhook-timestamp is too old";
  if (ts > nowS + toleranceS) return "webhook-timestamp is in the future";
  const offered = signatures.split(" ").filter((s) => s.startsWith("v1,"));
  let ok = false;
  for (const secret of secrets) {
    const expected = await sign(secret, id, timestamp, body);
    // Every offered signature is compared, so the time taken does not say which matched.
    for (const candidate of offered) ok = constantTimeEqual(candidate, expected) || ok;
  }
  return ok ? null : "no valid webhook-signature";
}
