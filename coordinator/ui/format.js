// Numbers, durations and instants as people read them: 1.2k, 3.4 M,
// 2.5/s, "3 m ago", "in 12 s". Every function takes plain values and
// answers a string, so the views stay declarative.

const SI = [
  [1e9, "G"],
  [1e6, "M"],
  [1e3, "k"],
];

/** A count: 999, 1.2k, 12k, 3.4M. */
export function count(n) {
  if (n === null || n === undefined) return "–";
  const abs = Math.abs(n);
  for (const [size, unit] of SI) {
    if (abs >= size) {
      const v = n / size;
      return `${v >= 100 ? Math.round(v) : v.toFixed(1).replace(/\.0$/, "")}${unit}`;
    }
  }
  return String(n);
}

/** A rate from `n` events in `windowMs`: 1.2k/s, 3.5/s, 12/min, 0. */
export function rate(n, windowMs) {
  if (!n) return "0";
  const perS = (n * 1000) / windowMs;
  if (perS >= 1) return `${count(perS >= 10 ? Math.round(perS) : Math.round(perS * 10) / 10)}/s`;
  const perMin = perS * 60;
  return `${perMin >= 10 ? Math.round(perMin) : Math.round(perMin * 10) / 10}/min`;
}

/** A duration in ms: 850 ms, 12 s, 3 m, 2 h 5 m, 4 d. */
export function duration(ms) {
  if (ms === null || ms === undefined) return "–";
  const s = Math.abs(ms) / 1000;
  if (s < 1) return `${Math.round(Math.abs(ms))} ms`;
  if (s < 10) return `${s.toFixed(1).replace(/\.0$/, "")} s`;
  if (s < 60) return `${Math.round(s)} s`;
  const m = s / 60;
  if (m < 60) return `${Math.floor(m)} m`;
  const h = m / 60;
  if (h < 24) {
    const rest = Math.floor(m % 60);
    return rest ? `${Math.floor(h)} h ${rest} m` : `${Math.floor(h)} h`;
  }
  return `${Math.floor(h / 24)} d`;
}

/** An instant relative to `now` (ms since the epoch): "3 m ago", "in 12 s". */
export function relative(iso, now) {
  if (!iso) return "–";
  const delta = Date.parse(iso) - now;
  if (Math.abs(delta) < 1000) return "now";
  return delta < 0 ? `${duration(-delta)} ago` : `in ${duration(delta)}`;
}

/** An instant as local date and time, for titles and detail rows. */
export function absolute(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return `${d.toLocaleString(undefined, { hour12: false })} (${iso})`;
}

/**
 * The last eight characters of a job id: ids are UUIDv7, whose leading
 * characters are the creation time and shared by every job of a minute;
 * the tail is random, enough to tell jobs of a page apart.
 */
export function shortId(id) {
  return id ? `…${id.slice(-8)}` : "";
}

/** A JSON value for a <pre>: pretty, or a dash when null. */
export function json(value) {
  if (value === null || value === undefined) return "–";
  return JSON.stringify(value, null, 2);
}
