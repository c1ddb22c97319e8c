#!/usr/bin/env node
/**
 * trellis-analyze (pnpm analyze): tunes an ensemble's steps for this machine under a p99
 * budget, against the real server, and writes the winner as a copy of the repository with
 * a report (analysis.html) at its root.
 */
import { resolve } from "node:path";
import { concurrencyRange } from "@trellis/client";
import { Command, InvalidArgumentError } from "commander";
import { analyze } from "./analyze.js";
import { verdictLine } from "./report.js";
import { describeSettings } from "./space.js";

const positive = (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError("a number above 0");
  return n;
};

const concurrencies = (v: string) => {
  try {
    return concurrencyRange(v);
  } catch (err) {
    throw new InvalidArgumentError((err as Error).message);
  }
};

const program = new Command("trellis-analyze")
  .description("search each ensemble step's instance count, dynamic batching and ONNX threads under a p99 budget")
  .requiredOption("--model-repository <dir>", "the repository (read only: never written)")
  .requiredOption("-m, --model <ensemble>", "the ensemble to tune")
  .requiredOption("--input-data <folder>", "a folder of images, sent as the ensemble's BYTES input")
  .requiredOption("--p99-ms <ms>", "the latency budget: p99 in milliseconds", positive)
  .option("-o, --output <dir>", "where the tuned copy of the repository and analysis.html go", "analysis-output")
  .option("--quick", "short windows, a short list of values, 5 rounds (a few minutes on 2 cores)")
  .option(
    "--concurrency-range <start:end:step>",
    "the concurrencies swept (default quick 1,2,4,8; full up to 32)",
    concurrencies,
  )
  .option("--measurement-interval <ms>", "each measurement window, ms", positive)
  .option("--rounds <n>", "interleaved rounds of the finalists against the shipped config", positive)
  .option("--search-deadline <s>", "stop starting new candidates after this many seconds", positive)
  .parse();

const o = program.opts<{
  modelRepository: string;
  model: string;
  inputData: string;
  p99Ms: number;
  output: string;
  quick?: boolean;
  concurrencyRange?: number[];
  measurementInterval?: number;
  rounds?: number;
  searchDeadline?: number;
}>();

const started = performance.now();
try {
  const result = await analyze({
    repository: o.modelRepository,
    ensemble: o.model,
    inputData: o.inputData,
    budgetMs: o.p99Ms,
    output: resolve(o.output),
    quick: o.quick ?? false,
    ...(o.concurrencyRange ? { concurrencies: o.concurrencyRange } : {}),
    ...(o.measurementInterval ? { windowMs: o.measurementInterval } : {}),
    ...(o.rounds ? { rounds: Math.round(o.rounds) } : {}),
    ...(o.searchDeadline ? { searchDeadlineMs: o.searchDeadline * 1000 } : {}),
    command: `pnpm analyze ${process.argv
      .slice(2)
      .map((a) => (/^[\w./:@,=-]+$/.test(a) ? a : `'${a.replace(/'/g, "'\\''")}'`))
      .join(" ")}`,
    log: (line) => console.log(line),
  });
  console.log(`\n${verdictLine(result)}`);
  console.log(`written: ${result.winner.trial.id} (${result.winner.trial.change || "the shipped config"})`);
  for (const f of result.finalists) {
    const t = f.throughput;
    const p = f.p99Ms;
    console.log(
      `  ${f.trial.id} c${f.concurrency}: ${t.median.toFixed(1)}/s (rounds ${t.min.toFixed(1)}-${t.max.toFixed(1)}), p99 ${p.median.toFixed(1)} ms (rounds ${p.min.toFixed(1)}-${p.max.toFixed(1)})`,
    );
  }
  for (const [step, s] of Object.entries(result.winner.trial.candidate))
    console.log(`  ${step}: ${describeSettings(s)}`);
  console.log(`tuned copy: ${result.output} (rewritten: ${result.rewritten.join(", ") || "none"})`);
  console.log(`report: ${result.reportPath} (${((performance.now() - started) / 1000).toFixed(0)} s)`);
} catch (err) {
  console.error(`trellis-analyze: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
