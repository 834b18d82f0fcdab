// The tests as a Cloudflare Worker, run in workerd by test/workerd-host.mjs:
// POST {env, scenarios, only} answers the report lines.
import { runScenario, type Env, type Scenario } from "./conformance.js";
import { libraryTests } from "./library.js";

export default {
  async fetch(request: Request): Promise<Response> {
    const { env, scenarios, only } = (await request.json()) as { env: Env; scenarios: Scenario[]; only: string[] };
    const lines: unknown[] = [];
    await Promise.all([
      ...scenarios.map(async (s) => lines.push(await runScenario(env, s))),
      ...libraryTests
        .filter((t) => only.length === 0 || only.includes(t.name))
        .map(async (t) => {
          const started = Date.now();
          try {
            await t.run(env);
            lines.push({ test: t.name, ok: true, ms: Date.now() - started });
          } catch (e) {
            lines.push({ test: t.name, ok: false, ms: Date.now() - started, error: e instanceof Error ? (e.stack ?? e.message) : String(e) });
          }
        }),
    ]);
    return new Response(lines.map((l) => JSON.stringify(l)).join("\n"), { headers: { "content-type": "application/x-ndjson" } });
  },
};
