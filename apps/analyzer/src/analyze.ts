/**
 * The analyzer end to end: read the ensemble, search, compare the finalists against the
 * shipped config in interleaved rounds, write the winner as a copy of the repository with the
 * report at its root (analysis.html, the one name the server's page links to).
 */
import { readFileSync } from "node:fs";
import { readdir, readFile, writeFile } from "node:fs/promises";
import { availableParallelism, cpus } from "node:os";
import { extname, join } from "node:path";
import { connectEndpoint, imageInput, imageRequests, measure } from "@trellis/client";
import type { InferRequest } from "@trellis/stage";
import { startServerProcess } from "@trellis/testing";
import { renderReport } from "./report.js";
import { readEnsemble, writeTunedCopy } from "./repository.js";
import type { AnalyzeResult, Machine } from "./result.js";
import { chooseWinner, judge, measureRounds, pickFinalists } from "./rounds.js";
import { search } from "./search.js";
import { searchSpace } from "./space.js";

export interface AnalyzeOptions {
  repository: string;
  ensemble: string;
  /** A folder of images: each request is one of them as the ensemble's BYTES input. */
  inputData: string;
  budgetMs: number;
  /** Where the tuned copy of the repository goes (with analysis.html at its root). */
  output: string;
  quick?: boolean;
  /** Defaults: quick 1,2,4,8 / full 1,2,4,8,16,32. */
  concurrencies?: number[];
  windowMs?: number;
  warmupMs?: number;
  rounds?: number;
  cores?: number;
  minGain?: number;
  /** Stop starting new candidates after this long. */
  searchDeadlineMs?: number;
  /** The command line that reproduces this analysis, for the report (default: built from these options). */
  command?: string;
  log?: (line: string) => void;
}

/** This machine, as the report states it. */
export function thisMachine(): Machine {
  let vnni = false;
  try {
    vnni = /\bavx512_vnni\b/.test(readFileSync("/proc/cpuinfo", "utf8"));
  } catch {
    // No /proc (not Linux): said as not known to have it.
  }
  return { cpu: cpus()[0]?.model.trim() ?? "unknown CPU", cores: availableParallelism(), vnni };
}

/** The pnpm analyze line for `options`. */
function commandOf(options: AnalyzeOptions): string {
  const q = (s: string) => (/^[\w./:@,-]+$/.test(s) ? s : `'${s.replace(/'/g, "'\\''")}'`);
  const parts = [
    "pnpm analyze --model-repository",
    q(options.repository),
    "-m",
    q(options.ensemble),
    "--input-data",
    q(options.inputData),
    "--p99-ms",
    String(options.budgetMs),
    "-o",
    q(options.output),
  ];
  if (options.quick) parts.push("--quick");
  if (options.rounds) parts.push("--rounds", String(options.rounds));
  return parts.join(" ");
}

const IMAGE_TYPES = new Set([".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"]);

/** The images of an --input-data folder, by name; none is an error naming the folder. */
export async function readImages(folder: string): Promise<Uint8Array[]> {
  const files = (await readdir(folder)).filter((f) => IMAGE_TYPES.has(extname(f).toLowerCase())).sort();
  if (files.length === 0) throw new Error(`--input-data ${folder}: no images (jpg, png, webp, …)`);
  return Promise.all(files.map(async (f) => new Uint8Array(await readFile(join(folder, f)))));
}

/** A window long enough for this many answers at the shipped config's rate: fewer make p99 the maximum. */
const ANSWERS_PER_WINDOW = { quick: 30, full: 100 };

/**
 * The folder's images as requests to the ensemble's BYTES input (its name from a server of the
 * shipped config's metadata), each answered once before anything is timed (a bad input fails
 * here, not mid-search), and the shipped config's rate at concurrency 1, to size the windows.
 */
async function prepareInputs(repository: string, ensemble: string, folder: string) {
  const images = await readImages(folder);
  const server = await startServerProcess(["--model-repository", repository]);
  const endpoint = connectEndpoint(server.grpc, "grpc");
  try {
    const input = imageInput(ensemble, await endpoint.metadata(ensemble));
    const requests: InferRequest[] = imageRequests(input, images, 1);
    for (const request of requests) await endpoint.infer(ensemble, request);
    const probe = await measure(endpoint, {
      model: ensemble,
      requests,
      batch: 1,
      concurrency: 1,
      windowMs: 1000,
      warmupMs: 200,
    });
    return { requests, rate: probe.throughput };
  } finally {
    endpoint.close();
    await server.stop();
  }
}

/** The measurement settings: the options given, else quick or full defaults, windows sized by `rate`. */
function measurementSettings(options: AnalyzeOptions, rate: number) {
  const quick = options.quick ?? false;
  const answers = quick ? ANSWERS_PER_WINDOW.quick : ANSWERS_PER_WINDOW.full;
  const sized = Math.ceil((answers / Math.max(rate, 0.1)) * 1000);
  return {
    concurrencies: options.concurrencies ?? (quick ? [1, 2, 4] : [1, 2, 4, 8, 16]),
    windowMs: options.windowMs ?? Math.min(quick ? 3000 : 15_000, Math.max(quick ? 1000 : 5000, sized)),
    warmupMs: options.warmupMs ?? (quick ? 300 : 2000),
    // The rounds decide: their windows are half again as long as the search's.
    roundWindowMs: 0,
    // Enough rounds to tell a win from the spread between rounds on a noisy 2-core machine.
    rounds: options.rounds ?? (quick ? 5 : 7),
    cores: options.cores ?? availableParallelism(),
    quick,
  };
}

export type { AnalyzeResult };

export async function analyze(options: AnalyzeOptions): Promise<AnalyzeResult> {
  const log = options.log ?? (() => {});
  const repo = await readEnsemble(options.repository, options.ensemble);
  const { requests, rate } = await prepareInputs(repo.root, repo.ensemble, options.inputData);
  const settings = measurementSettings(options, rate);
  settings.roundWindowMs = Math.round(settings.windowMs * 1.5);
  const { quick, cores } = settings;
  log(`shipped config at concurrency 1: ${rate.toFixed(1)}/s; windows of ${settings.windowMs} ms`);
  const window = { model: repo.ensemble, requests, windowMs: settings.windowMs, warmupMs: settings.warmupMs };
  const found = await search(repo, {
    ...window,
    concurrencies: settings.concurrencies,
    budgetMs: options.budgetMs,
    space: searchSpace(cores, quick),
    minGain: options.minGain ?? 0.05,
    // Quick mode keeps to its 3 minutes: no new candidate after 100 s (the bottleneck step goes first).
    ...(options.searchDeadlineMs !== undefined || quick ? { deadlineMs: options.searchDeadlineMs ?? 100_000 } : {}),
    log,
  });
  const finalists = await measureRounds(repo, pickFinalists(found.trials, found.best), {
    ...window,
    windowMs: settings.roundWindowMs,
    rounds: settings.rounds,
    budgetMs: options.budgetMs,
    concurrencies: settings.concurrencies,
    log,
  });
  const verdict = judge(finalists, options.budgetMs);
  const winner = chooseWinner(finalists, options.budgetMs);
  const rewritten = await writeTunedCopy(repo, winner.trial.candidate, options.output);
  const result: AnalyzeResult = {
    ensemble: repo.ensemble,
    budgetMs: options.budgetMs,
    shipped: repo.shipped,
    trials: found.trials,
    finalists,
    winner,
    verdict,
    machine: thisMachine(),
    command: options.command ?? commandOf(options),
    rewritten,
    output: options.output,
    reportPath: join(options.output, "analysis.html"),
    settings,
  };
  await writeFile(result.reportPath, renderReport(result));
  await writeFile(join(options.output, "analysis.json"), `${JSON.stringify(result, null, 2)}\n`);
  return result;
}
