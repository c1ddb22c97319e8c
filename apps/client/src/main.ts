#!/usr/bin/env node
/**
 * trellis-client: the client tools, for Trellis or Triton over gRPC or HTTP.
 *   classify <images...>   the seed ensemble's top-5 for each image
 *   perf                   perf_analyzer's measurement over a concurrency range
 * Flags follow tritonclient's and perf_analyzer's (-u, -i, -m, -b, --concurrency-range).
 */
import { readFile, writeFile } from "node:fs/promises";
import { resolve } from "node:path";
import cliProgress from "cli-progress";
import { Command, InvalidArgumentError, Option } from "commander";
import { classify, formatClassification } from "./classify.js";
import { connectEndpoint, DEFAULT_URLS, describeError, type Endpoint, type Protocol } from "./endpoint.js";
import { imageInput, imageRequests, randomRequest } from "./inputs.js";
import {
  concurrencyRange,
  formatResult,
  latencyReport,
  measure,
  measureRate,
  type PerfResult,
  type RequestDistribution,
  requestRateRange,
  sequenceIdRange,
} from "./perf.js";

const positive = (v: string) => {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) throw new InvalidArgumentError("a whole number, at least 1");
  return n;
};

/** A parser for commander: its errors as commander's, so they print as one usage line. */
const asOption =
  <T>(parse: (v: string) => T) =>
  (v: string): T => {
    try {
      return parse(v);
    } catch (err) {
      throw new InvalidArgumentError((err as Error).message);
    }
  };

interface Common {
  url?: string;
  protocol: Protocol;
  modelName: string;
}

const program = new Command("trellis-client")
  .description("Client tools for a KServe v2 server (Trellis or Triton), over gRPC or HTTP/REST.")
  .addOption(new Option("-i, --protocol <protocol>", "grpc or http").choices(["grpc", "http"]).default("grpc"))
  .option("-u, --url <host:port>", "server address (default: localhost:8001 for grpc, localhost:8000 for http)")
  .option("-m, --model-name <name>", "model to send to", "resnet50_ensemble");

const endpointOf = (opts: Common): Endpoint => connectEndpoint(opts.url ?? DEFAULT_URLS[opts.protocol], opts.protocol);
const readImages = (paths: string[]) =>
  Promise.all(paths.map(async (p) => new Uint8Array(await readFile(resolve(process.env.INIT_CWD ?? ".", p)))));

program
  .command("classify")
  .description("send each image (JPEG/PNG bytes) to the model's BYTES input and print its answer")
  .argument("<images...>", "image files")
  .option("-b, --batch-size <n>", "images per request", positive, 1)
  .option("--classes <k>", "top-k for a numeric output (Triton's classification extension)", positive, 5)
  .option("--json", "print each output string as the server sent it (the ensemble's top-5 JSON)")
  .action(async (paths: string[], opts: { batchSize: number; classes: number; json?: boolean }) => {
    const common = program.opts<Common>();
    const endpoint = endpointOf(common);
    try {
      const results = await classify(endpoint, common.modelName, await readImages(paths), {
        batch: opts.batchSize,
        classes: opts.classes,
      });
      if (opts.json) {
        for (const r of results) {
          console.log(`${paths[r.image]}:`);
          if (r.error) console.log(`  error: ${r.error}`);
          for (const [name, strings] of Object.entries(r.outputs)) {
            for (const s of strings) console.log(`  ${name}: ${s}`);
          }
        }
      } else {
        for (const r of results) console.log(formatClassification(paths[r.image] ?? String(r.image), r));
      }
      if (results.some((r) => r.error)) process.exitCode = 1;
    } finally {
      endpoint.close();
    }
  });

program
  .command("perf")
  .description("measure throughput and latency at each concurrency, as perf_analyzer does")
  .addOption(
    new Option("--concurrency-range <start:end:step>", "requests kept in flight")
      .argParser(asOption(concurrencyRange))
      .default([1], "1"),
  )
  .option("-p, --measurement-interval <ms>", "measurement window per concurrency", positive, 5000)
  .option("--warmup-interval <ms>", "uncounted calls before each window", positive, 1000)
  .option("-b, --batch-size <n>", "items per request", positive, 1)
  .option(
    "--input-data <images...>",
    "images for the model's BYTES input (default: random data shaped by the model's metadata)",
  )
  .addOption(
    new Option(
      "--request-rate-range <start:end:step>",
      "instead of a concurrency, send this many requests per second, whatever the answers take (an open loop)",
    ).argParser(asOption(requestRateRange)),
  )
  .addOption(
    new Option("--request-distribution <kind>", "the request-rate schedule: even gaps, or a Poisson process's")
      .choices(["constant", "poisson"])
      .default("constant"),
  )
  .option("--streaming", "send each caller's requests on a gRPC ModelStreamInfer stream of its own (gRPC only)")
  .option(
    "--sequence-length <n>",
    "a stateful model (sequence_batching): each caller sends sequences of n requests, flagged start and end",
    positive,
  )
  .addOption(
    new Option("--sequence-id-range <start:end>", "correlation IDs for the sequences, given out in turn")
      .argParser(asOption(sequenceIdRange))
      .default([1, 2 ** 32 - 1], "1:4294967295"),
  )
  .option("-f, --latency-report-file <path>", "also write the results as CSV, one row per concurrency")
  .action(
    async (opts: {
      concurrencyRange: number[];
      measurementInterval: number;
      warmupInterval: number;
      batchSize: number;
      inputData?: string[];
      streaming?: boolean;
      latencyReportFile?: string;
      requestRateRange?: number[];
      requestDistribution: RequestDistribution;
      sequenceLength?: number;
      sequenceIdRange: number[];
    }) => {
      const common = program.opts<Common>();
      if (opts.streaming && common.protocol !== "grpc") {
        throw new RangeError("--streaming needs -i grpc (ModelStreamInfer), as perf_analyzer's");
      }
      const perf = program.commands.find((c) => c.name() === "perf");
      if (opts.requestRateRange && perf?.getOptionValueSource("concurrencyRange") === "cli") {
        throw new RangeError("--request-rate-range and --concurrency-range are two ways to load: choose one");
      }
      if (opts.requestRateRange && opts.streaming) {
        throw new RangeError("--streaming sends one request at a time per stream: use it with --concurrency-range");
      }
      if (opts.requestRateRange && opts.sequenceLength) {
        throw new RangeError(
          "--sequence-length: each caller drives its sequences in turn: use it with --concurrency-range",
        );
      }
      const [firstId, lastId] = opts.sequenceIdRange as [number, number];
      const sequences = opts.sequenceLength ? { length: opts.sequenceLength, firstId, lastId } : undefined;
      const endpoint = endpointOf(common);
      const model = common.modelName;
      try {
        const metadata = await endpoint.metadata(model);
        const requests = opts.inputData
          ? imageRequests(imageInput(model, metadata), await readImages(opts.inputData), opts.batchSize)
          : [randomRequest(metadata, opts.batchSize)];
        console.log("*** Measurement Settings ***");
        console.log(`  Model: ${model} over ${common.protocol} (${common.url ?? DEFAULT_URLS[common.protocol]})`);
        console.log(`  Batch size: ${opts.batchSize}`);
        console.log(
          `  Measurement window: ${opts.measurementInterval} msec (after ${opts.warmupInterval} msec uncounted)`,
        );
        console.log(`  Input: ${opts.inputData ? `${opts.inputData.length} images` : "random data"}`);
        console.log(
          `  Requests: ${opts.streaming ? "a gRPC stream per caller (ModelStreamInfer)" : "unary calls"}${opts.requestRateRange ? `, sent at a fixed rate (${opts.requestDistribution})` : ""}${sequences ? `, in sequences of ${sequences.length} (IDs ${firstId}:${lastId})` : ""}\n`,
        );
        const results: PerfResult[] = [];
        const bar = process.stderr.isTTY
          ? new cliProgress.SingleBar(
              { format: `  ${opts.requestRateRange ? "request rate" : "concurrency"} {c} [{bar}] {percentage}%` },
              cliProgress.Presets.shades_classic,
            )
          : undefined;
        const window = { model, requests, batch: opts.batchSize, windowMs: opts.measurementInterval };
        const loads = opts.requestRateRange ?? opts.concurrencyRange;
        for (const load of loads) {
          bar?.start(100, 0, { c: load });
          const onProgress = (f: number) => bar?.update(Math.round(f * 100), { c: load });
          const r = opts.requestRateRange
            ? await measureRate(endpoint, {
                ...window,
                rate: load,
                distribution: opts.requestDistribution,
                warmupMs: opts.warmupInterval,
                onProgress,
              })
            : await measure(endpoint, {
                ...window,
                concurrency: load,
                warmupMs: opts.warmupInterval,
                onProgress,
                streaming: opts.streaming,
                ...(sequences ? { sequences } : {}),
              });
          bar?.stop();
          results.push(r);
          console.log(`${formatResult(r, common.protocol)}\n`);
        }
        if (opts.latencyReportFile) await writeFile(opts.latencyReportFile, latencyReport(results));
        console.log("Inferences/Second vs. Client p95 Latency");
        for (const r of results) {
          const load = r.requestRate !== undefined ? `Request Rate: ${r.requestRate}` : `Concurrency: ${r.concurrency}`;
          console.log(`${load}, throughput: ${r.throughput.toFixed(2)} infer/sec, latency ${r.latencyUs.p95} usec`);
        }
      } finally {
        endpoint.close();
      }
    },
  );

program.parseAsync().catch((err: unknown) => {
  console.error(`trellis-client: ${describeError(err)}`);
  process.exit(1);
});
