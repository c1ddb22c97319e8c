/**
 * Summarises trace files written by --trace-config (or by Triton): where each model's
 * requests spent their time, median and mean. Several files (a log-frequency series:
 * trace.json.0 trace.json.1 ...) are read as one.
 * Run: pnpm --filter @trellis/server trace:summary <trace file>... (paths from where pnpm was run)
 */
import { readFile } from "node:fs/promises";
import { resolve } from "node:path";
import { summarizeTraces } from "./summarize.js";

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: trace-summary <trace file>...");
  process.exit(2);
}
// pnpm runs scripts in the package's folder; INIT_CWD is where it was run from.
const base = process.env.INIT_CWD ?? process.cwd();
const entries: unknown[] = [];
for (const file of files) {
  const parsed: unknown = JSON.parse(await readFile(resolve(base, file), "utf8"));
  if (!Array.isArray(parsed)) throw new Error(`${file}: not a trace file (expected a JSON array)`);
  entries.push(...parsed);
}
console.log(summarizeTraces(entries));
