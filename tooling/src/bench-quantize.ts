#!/usr/bin/env node
// Bare ONNX Runtime throughput, fp32 vs int8, same run, same options:
// node dist/bench-quantize.js FP32.onnx INT8.onnx [--batches 1,8] [--runs 20] [--threads 1] [--profile DIR]
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { Command } from "commander";
import * as ort from "onnxruntime-node";
import { scriptArgv } from "./argv.js";

if (process.env.INIT_CWD) process.chdir(process.env.INIT_CWD);
const program = new Command("bench-quantize")
  .argument("<fp32>")
  .argument("<int8>")
  .option("--batches <list>", "batch sizes", "1,8")
  .option("--runs <n>", "timed runs per batch", "20")
  .option("--threads <n>", "intra-op threads", "1")
  .option("--profile <dir>", "write ORT profiles (one run of each model at batch 1) there")
  .parse(scriptArgv());
const [fp32, int8] = program.args as [string, string];
const o = program.opts<{ batches: string; runs: string; threads: string; profile?: string }>();
const runs = Number(o.runs);
const threads = Number(o.threads);
const options = (): ort.InferenceSession.SessionOptions => ({
  intraOpNumThreads: threads,
  interOpNumThreads: 1,
  graphOptimizationLevel: "all",
});
const sessions = {
  fp32: await ort.InferenceSession.create(fp32, options()),
  int8: await ort.InferenceSession.create(int8, options()),
};
console.log(`threads ${threads}, ${runs} interleaved runs per row, images/s (median run)`);
for (const batch of o.batches.split(",").map(Number)) {
  const x = new ort.Tensor(
    "float32",
    new Float32Array(batch * 3 * 224 * 224).map((_, i) => Math.sin(i)),
    [batch, 3, 224, 224],
  );
  // Interleaved: one fp32 run, then one int8 run, so a busy moment on a shared machine hits both.
  const feeds = Object.values(sessions).map((s) => ({ [s.inputNames[0]!]: x }));
  const [fp32Session, int8Session] = [sessions.fp32, sessions.int8];
  await fp32Session.run(feeds[0]!);
  await int8Session.run(feeds[1]!);
  const times = { fp32: [] as number[], int8: [] as number[] };
  const ratios: number[] = [];
  const timed = async (s: ort.InferenceSession, feed: ort.InferenceSession.FeedsType) => {
    const t = performance.now();
    await s.run(feed);
    return performance.now() - t;
  };
  for (let i = 0; i < runs; i++) {
    const a = await timed(fp32Session, feeds[0]!);
    const b = await timed(int8Session, feeds[1]!);
    times.fp32.push(a);
    times.int8.push(b);
    ratios.push(a / b);
  }
  const median = (v: number[]) => [...v].sort((p, q) => p - q)[Math.floor(v.length / 2)]!;
  const rate = { fp32: (batch * 1000) / median(times.fp32), int8: (batch * 1000) / median(times.int8) };
  console.log(
    `batch ${batch}: fp32 ${rate.fp32.toFixed(1)}, int8 ${rate.int8.toFixed(1)}, int8/fp32 ${(rate.int8 / rate.fp32).toFixed(2)}x (median of per-pair ratios ${median(ratios).toFixed(2)}x, ${Math.min(...ratios).toFixed(2)}-${Math.max(...ratios).toFixed(2)})`,
  );
}
if (o.profile) {
  await mkdir(o.profile, { recursive: true });
  for (const [name, path] of Object.entries({ fp32, int8 })) {
    const s = await ort.InferenceSession.create(path, {
      ...options(),
      enableProfiling: true,
      profileFilePrefix: join(o.profile, name),
    });
    const x = new ort.Tensor("float32", new Float32Array(3 * 224 * 224), [1, 3, 224, 224]);
    await s.run({ [s.inputNames[0]!]: x });
    s.endProfiling();
    await s.release();
  }
  console.log(`profiles in ${o.profile}`);
}
