// Fails when the built library imports anything but its own files: a
// Web-standard runtime (workerd) has no Node.js modules and no npm packages.
import { readdirSync, readFileSync } from "node:fs";

// The folder to check: dist/ by default (the Rust test also gives it one with a bad import).
const dist = process.argv[2] ? `${process.argv[2].replace(/\/+$/, "")}/` : new URL("../dist/", import.meta.url).pathname;
const files = readdirSync(dist).filter((f) => f.endsWith(".js"));
if (files.length === 0) throw new Error("dist/ holds no .js file: build first");
const bad = [];
const specifier = /(?:\bimport\s*(?:[\w*{}\s,]+\s*from\s*)?|\bexport\s*[\w*{}\s,]+\s*from\s*|\bimport\s*\(\s*|\brequire\s*\(\s*)["'`]([^"'`]+)["'`]/g;
for (const f of files) {
  const text = readFileSync(dist + f, "utf8");
  for (const m of text.matchAll(specifier)) {
    if (!m[1].startsWith("./")) bad.push(`${f}: imports ${m[1]}`);
  }
  if (/\brequire\s*\(|\bprocess\.|\bBuffer\b|__dirname/.test(text)) bad.push(`${f}: uses a Node.js global`);
}
if (bad.length > 0) {
  console.error(`dist/ must import only its own files:\n${bad.join("\n")}`);
  process.exit(1);
}
console.log(JSON.stringify({ test: "dist_imports_only_its_own_files", ok: true, files: files.length }));
