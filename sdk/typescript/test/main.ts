// Runs the conformance scenarios and the library's own tests in the current
// runtime (Node.js, Deno or Bun), against the coordinator at RUNLEASE_URL,
// and prints one JSON line per scenario and test. Exit status 1 when any failed.
import { readdirSync, readFileSync } from "node:fs";
import { runScenario, type Env, type Scenario } from "./conformance.js";
import { libraryTests } from "./library.js";

declare const process: { env: Record<string, string | undefined>; argv: string[]; exit(code: number): never };

const url = process.env["RUNLEASE_URL"];
if (!url) {
  console.error("RUNLEASE_URL must name a live coordinator");
  process.exit(2);
}
const env: Env = { url, key: process.env["RUNLEASE_KEY"] || undefined };
const dir = process.env["RUNLEASE_SCENARIOS"] ?? new URL("../../conformance/scenarios/", import.meta.url).pathname;
const only = process.argv.slice(2).filter((a) => !a.startsWith("-"));
const scenarios: Scenario[] = readdirSync(dir)
  .filter((f) => f.endsWith(".json"))
  .sort()
  .map((f) => JSON.parse(readFileSync(`${dir}/${f}`, "utf8")) as Scenario)
  .filter((s) => only.length === 0 || only.includes(s.name));

const results = await Promise.all([
  ...scenarios.map(async (s) => {
    const r = await runScenario(env, s);
    console.log(JSON.stringify(r));
    return r.ok;
  }),
  ...libraryTests
    .filter((t) => only.length === 0 || only.includes(t.name))
    .map(async (t) => {
      const started = Date.now();
      try {
        await t.run(env);
        console.log(JSON.stringify({ test: t.name, ok: true, ms: Date.now() - started }));
        return true;
      } catch (e) {
        console.log(JSON.stringify({ test: t.name, ok: false, ms: Date.now() - started, error: e instanceof Error ? e.stack ?? e.message : String(e) }));
        return false;
      }
    }),
]);
const failed = results.filter((ok) => !ok).length;
console.log(JSON.stringify({ runtime: runtimeName(), passed: results.length - failed, failed }));
process.exit(failed === 0 && results.length > 0 ? 0 : 1);

function runtimeName(): string {
  const g = globalThis as Record<string, unknown>;
  if (g["Deno"]) return "deno";
  if (g["Bun"]) return "bun";
  return "node";
}
