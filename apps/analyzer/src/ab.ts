#!/usr/bin/env node
/**
 * trellis-analyze-ab (pnpm analyze:ab): the check of an analysis, apart from it. Two repositories
 * (the shipped one and the analyzer's tuned copy) each served by the real server at once, measured
 * in interleaved rounds (the order reversed each round) under one p99 budget: per round and
 * repository, concurrencies rise until one is over the budget, and the round's score is the
 * highest throughput whose p99 is within it. Prints every round, the medians with their spread,
 * and B/A per round.
 */
import { resolve } from "node:path";
import { concurrencyRange, connectEndpoint, imageInput, imageRequests, measure } from "@trellis/client";
import { interleavedRounds, median, startServerProcess } from "@trellis/testing";
import { Command, InvalidArgumentError } from "commander";
import { readImages } from "./analyze.js";
import { type SweepPoint, toPoint } from "./measure.js";
import { roundScore } from "./rounds.js";

const positive = (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError("a number above 0");
  return n;
};

const o = new Command("trellis-analyze-ab")
  .description("A/B two repositories' configs of one ensemble at one p99 budget, in interleaved rounds")
  .requiredOption("--a <dir>", "repository A (the shipped config)")
  .requiredOption("--b <dir>", "repository B (e.g. the analyzer's tuned copy)")
  .requiredOption("-m, --model <ensemble>", "the ensemble")
  .requiredOption("--input-data <folder>", "images sent as the ensemble's BYTES input")
  .requiredOption("--p99-ms <ms>", "the latency budget", positive)
  .option("--rounds <n>", "interleaved rounds", positive, 6)
  .option("--concurrency-range <start:end:step>", "concurrencies, swept upwards each round", "1:6:1")
  .option("--measurement-interval <ms>", "each window, after a warm-up of a fifth of it", positive, 4000)
  .parse()
  .opts<{
    a: string;
    b: string;
    model: string;
    inputData: string;
    p99Ms: number;
    rounds: number;
    concurrencyRange: string;
    measurementInterval: number;
  }>();

const images = await readImages(o.inputData);
const concurrencies = concurrencyRange(o.concurrencyRange);

const subjects = await Promise.all(
  (["A", "B"] as const).map(async (label) => {
    const dir = resolve(label === "A" ? o.a : o.b);
    const server = await startServerProcess(["--model-repository", dir]);
    const endpoint = connectEndpoint(server.grpc, "grpc");
    const requests = imageRequests(imageInput(o.model, await endpoint.metadata(o.model)), images, 1);
    for (const request of requests) await endpoint.infer(o.model, request);
    return { label, dir, server, endpoint, requests, rounds: [] as SweepPoint[] };
  }),
);
try {
  await interleavedRounds(subjects, Math.round(o.rounds), async (s, round) => {
    const points: SweepPoint[] = [];
    for (const concurrency of concurrencies) {
      const window = { model: o.model, requests: s.requests, batch: 1, concurrency };
      const point = toPoint(
        await measure(s.endpoint, { ...window, windowMs: o.measurementInterval, warmupMs: o.measurementInterval / 5 }),
      );
      points.push(point);
      if (point.p99Ms > o.p99Ms) break;
    }
    const best = roundScore(points, o.p99Ms);
    s.rounds.push(best.p99Ms <= o.p99Ms ? best : { ...best, throughput: 0 });
    const sweep = points
      .map((p) => `c${p.concurrency} ${p.throughput.toFixed(1)}/s p99 ${p.p99Ms.toFixed(0)}`)
      .join(", ");
    console.log(`round ${round + 1} ${s.label}: ${sweep} -> ${best.throughput.toFixed(1)}/s at c${best.concurrency}`);
  });
} finally {
  for (const s of subjects) {
    s.endpoint.close();
    await s.server.stop();
  }
}

const [a, b] = subjects as [(typeof subjects)[0], (typeof subjects)[0]];
const fmt = (xs: number[], digits: number) =>
  `${median(xs).toFixed(digits)} (${Math.min(...xs).toFixed(digits)}–${Math.max(...xs).toFixed(digits)})`;
const ratios = a.rounds.map((r, i) => (b.rounds[i]?.throughput ?? 0) / r.throughput);
console.log(`\nthroughput within p99 <= ${o.p99Ms} ms, median (min–max) of ${o.rounds} rounds:`);
for (const s of subjects) {
  console.log(
    `${s.label} ${s.dir}: ${fmt(
      s.rounds.map((r) => r.throughput),
      1,
    )}/s, p99 ${fmt(
      s.rounds.map((r) => r.p99Ms),
      0,
    )} ms, concurrency ${s.rounds.map((r) => r.concurrency).join(",")}`,
  );
}
console.log(`B/A per round: ${ratios.map((r) => r.toFixed(2)).join(", ")}; median ${median(ratios).toFixed(2)}`);
