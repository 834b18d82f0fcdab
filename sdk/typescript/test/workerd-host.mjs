// Runs test-dist/workerd.mjs in real workerd (through miniflare) and prints its
// report lines; exit status 1 when any failed.
import { readdirSync, readFileSync } from "node:fs";
import { Miniflare } from "miniflare";

const url = process.env.RUNLEASE_URL;
if (!url) {
  console.error("RUNLEASE_URL must name a live coordinator");
  process.exit(2);
}
const dir = new URL("../../conformance/scenarios/", import.meta.url).pathname;
const only = process.argv.slice(2);
const scenarios = readdirSync(dir)
  .filter((f) => f.endsWith(".json"))
  .sort()
  .map((f) => JSON.parse(readFileSync(dir + f, "utf8")))
  .filter((s) => only.length === 0 || only.includes(s.name));
const mf = new Miniflare({
  modules: true,
  scriptPath: new URL("../test-dist/workerd.mjs", import.meta.url).pathname,
  compatibilityDate: "2025-01-01",
});
try {
  const response = await mf.dispatchFetch("http://sdk-tests.local/", {
    method: "POST",
    body: JSON.stringify({ env: { url, key: process.env.RUNLEASE_KEY || undefined }, scenarios, only }),
  });
  const text = await response.text();
  if (response.status !== 200) {
    console.error(`the Worker answered ${response.status}: ${text}`);
    process.exit(1);
  }
  const lines = text.split("\n").filter(Boolean).map((l) => JSON.parse(l));
  for (const l of lines) console.log(JSON.stringify(l));
  const failed = lines.filter((l) => !l.ok).length;
  console.log(JSON.stringify({ runtime: "workerd", passed: lines.length - failed, failed }));
  process.exitCode = failed === 0 && lines.length > 0 ? 0 : 1;
} finally {
  await mf.dispose();
}
