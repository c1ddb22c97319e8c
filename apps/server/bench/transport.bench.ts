/**
 * Where a concurrency-1 call's time goes between client and server: the server process
 * (models/ as committed) runs with stream-timing.ts preloaded, @grpc/grpc-js sends
 * 1920x1080 JPEGs one at a time, and both ends' stamps (one monotonic clock) give the
 * medians of: client send -> server stream, request body, the server's work, answer
 * headers -> trailers, trailers -> client done. The timed calls are also traced
 * (--trace-config, turned on after the warm-up), and the trace summary printed:
 * where the server's work went (each step, the hand-offs between them).
 * Run: pnpm --filter @trellis/server bench:transport (after pnpm build). Env: TRANSPORT_N (default 120).
 */
import { mkdtempSync, readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { frameBytes } from "@trellis/kserve/wire";
import { grpcJsInferenceClient, median, startServerProcess } from "@trellis/testing";
import { summarizeTraces } from "../tools/summarize.js";
import { fullHdPhotos } from "./photos.js";
import type { StreamStamps } from "./stream-timing.js";

const N = Number(process.env.TRANSPORT_N ?? 120);
const now = () => Number(process.hrtime.bigint()) / 1e6;
const work = mkdtempSync(join(tmpdir(), "trellis-transport-"));
const out = join(work, "stamps.json");
const traceFile = join(work, "trace.json");

const photos = await fullHdPhotos();
process.env.NODE_OPTIONS = `--import=${join(import.meta.dirname, "stream-timing.js")}`;
process.env.STREAM_TIMING_OUT = out;
const server = await startServerProcess([
  "--model-repository",
  join(import.meta.dirname, "..", "..", "..", "..", "models"),
  "--trace-config",
  `triton,file=${traceFile}`,
]);
delete process.env.NODE_OPTIONS;
const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
const call = (image: Uint8Array) =>
  client.modelInfer({
    model_name: "resnet50_ensemble",
    inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
    raw_input_contents: [Buffer.from(frameBytes([image]))],
  });
const warmup = 20;
for (let i = 0; i < warmup; i++) await call(photos[i % photos.length] as Uint8Array);
const tracing = await fetch(`${server.http}/v2/trace/setting`, {
  method: "POST",
  body: JSON.stringify({ trace_level: ["TIMESTAMPS"], trace_rate: "1" }),
});
if (tracing.status !== 200) throw new Error(`turning tracing on: ${tracing.status} ${await tracing.text()}`);
const calls: { start: number; done: number }[] = [];
for (let i = 0; i < N; i++) {
  const start = now();
  await call(photos[i % photos.length] as Uint8Array);
  calls.push({ start, done: now() });
}
client.close();
await server.stop("SIGTERM");
const stamps = (JSON.parse(readFileSync(out, "utf8")) as StreamStamps[]).slice(-N);
const med = (f: (c: { start: number; done: number }, s: StreamStamps) => number) =>
  median(calls.map((c, i) => f(c, stamps[i] as StreamStamps))).toFixed(2);
const rows: [string, string][] = [
  ["whole call", med((c) => c.done - c.start)],
  ["client send -> server stream", med((c, s) => s.arrived - c.start)],
  ["request body", med((_, s) => (s.bodyEnd ?? s.arrived) - s.arrived)],
  ["server's work (body end -> answer headers)", med((_, s) => (s.respond ?? 0) - (s.bodyEnd ?? 0))],
  ["answer headers -> trailers", med((_, s) => (s.trailers ?? 0) - (s.respond ?? 0))],
  ["trailers -> client done", med((c, s) => c.done - (s.trailers ?? 0))],
];
console.log(`transport: ${N} sequential grpc-js calls (1920x1080 JPEG), models/ as committed; medians in ms`);
for (const [what, ms] of rows) console.log(`${what.padEnd(44)} ${ms}`);
console.log(`\nthe same calls' traces (pnpm trace:summary ${traceFile}):\n`);
console.log(summarizeTraces(JSON.parse(await readFile(traceFile, "utf8"))));
