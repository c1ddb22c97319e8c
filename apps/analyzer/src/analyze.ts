/**
 * The analyzer end to end: read the ensemble, search, compare the finalists against the
 * shipped config in interleaved rounds, write the winner as a copy of the repository with the
 * report at its root (analysis.html, the one name the server's page links to).
 */
import { readdir, readFile, writeFile } from "node:fs/promises";
import { availableParallelism } from "node:os";
import { extname, join } from "node:path";
import { connectEndpoint, imageInput, imageRequests } from "@trellis/client";
import type { InferRequest } from "@trellis/stage";
import { startServerProcess } from "@trellis/testing";
import { renderReport } from "./report.js";
import { readEnsemble, writeTunedCopy } from "./repository.js";
import type { AnalyzeResult } from "./result.js";
import { chooseWinner, measureRounds, pickFinalists } from "./rounds.js";
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
  log?: (line: string) => void;
}

const IMAGE_TYPES = new Set([".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff"]);

/** The folder's images as requests to the ensemble's BYTES input (its name from a server's metadata). */
async function imageFolderRequests(repository: string, ensemble: string, folder: string): Promise<InferRequest[]> {
  const files = (await readdir(folder)).filter((f) => IMAGE_TYPES.has(extname(f).toLowerCase())).sort();
  if (files.length === 0) throw new Error(`--input-data ${folder}: no images (jpg, png, webp, …)`);
  const images = await Promise.all(files.map(async (f) => new Uint8Array(await readFile(join(folder, f)))));
  // The input's name and shape as the server reports them, from a short-lived server of the shipped config.
  const server = await startServerProcess(["--model-repository", repository]);
  const endpoint = connectEndpoint(server.grpc, "grpc");
  try {
    const input = imageInput(ensemble, await endpoint.metadata(ensemble));
    const requests = imageRequests(input, images, 1);
    // Every image answers before anything is timed: a bad input fails here, not mid-search.
    for (const request of requests) await endpoint.infer(ensemble, request);
    return requests;
  } finally {
    endpoint.close();
    await server.stop();
  }
}

export type { AnalyzeResult };

export async function analyze(options: AnalyzeOptions): Promise<AnalyzeResult> {
  const log = options.log ?? (() => {});
  const quick = options.quick ?? false;
  const cores = options.cores ?? availableParallelism();
  const settings = {
    concurrencies: options.concurrencies ?? (quick ? [1, 2, 4, 8] : [1, 2, 4, 8, 16, 32]),
    windowMs: options.windowMs ?? (quick ? 1500 : 5000),
    warmupMs: options.warmupMs ?? (quick ? 500 : 2000),
    rounds: options.rounds ?? (quick ? 3 : 5),
    cores,
    quick,
  };
  const repo = await readEnsemble(options.repository, options.ensemble);
  const requests = await imageFolderRequests(repo.root, repo.ensemble, options.inputData);
  const window = { model: repo.ensemble, requests, windowMs: settings.windowMs, warmupMs: settings.warmupMs };
  const found = await search(repo, {
    ...window,
    concurrencies: settings.concurrencies,
    budgetMs: options.budgetMs,
    space: searchSpace(cores, quick),
    minGain: options.minGain ?? 0.05,
    ...(options.searchDeadlineMs !== undefined ? { deadlineMs: options.searchDeadlineMs } : {}),
    log,
  });
  const finalists = await measureRounds(repo, pickFinalists(found.trials, found.best), {
    ...window,
    rounds: settings.rounds,
    budgetMs: options.budgetMs,
    log,
  });
  const winner = chooseWinner(finalists, options.budgetMs);
  const rewritten = await writeTunedCopy(repo, winner.trial.candidate, options.output);
  const result: AnalyzeResult = {
    ensemble: repo.ensemble,
    budgetMs: options.budgetMs,
    shipped: repo.shipped,
    trials: found.trials,
    finalists,
    winner,
    rewritten,
    output: options.output,
    reportPath: join(options.output, "analysis.html"),
    settings,
  };
  await writeFile(result.reportPath, renderReport(result));
  await writeFile(join(options.output, "analysis.json"), `${JSON.stringify(result, null, 2)}\n`);
  return result;
}
