// Bundles the tests (with the built library from dist/ and the independent
// Standard Webhooks signer) into test-dist/: one module for Node.js, Deno and
// Bun, one for workerd.
import { build } from "esbuild";

const common = { mainFields: ["module", "main"], bundle: true, format: "esm", target: "es2022", logLevel: "warning" };
await build({ ...common, entryPoints: ["test/main.ts"], outfile: "test-dist/main.mjs", platform: "neutral", external: ["node:*"] });
await build({ ...common, entryPoints: ["test/workerd.ts"], outfile: "test-dist/workerd.mjs", platform: "neutral" });
