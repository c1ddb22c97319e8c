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
console.log(`threads ${threads}, ${runs} runs per row, images/s (median run)`);
for (const batch of o.batches.split(",").map(Number)) {
  const x = new ort.Tensor(
    "float32",
    new Float32Array(batch * 3 * 224 * 224).map((_, i) => Math.sin(i)),
    [batch, 3, 224, 224],
  );
  const rate: Record<string, number> = {};
  for (const [name, s] of Object.entries(sessions)) {
    const feed = { [s.inputNames[0]!]: x };
    await s.run(feed);
    const times: number[] = [];
    for (let i = 0; i < runs; i++) {
      const t = performance.now();
      await s.run(feed);
      times.push(performance.now() - t);
    }
    times.sort((a, b) => a - b);
    rate[name] = (batch * 1000) / times[Math.floor(times.length / 2)]!;
  }
  console.log(
    `batch ${batch}: fp32 ${rate.fp32!.toFixed(1)}, int8 ${rate.int8!.toFixed(1)}, int8/fp32 ${(rate.int8! / rate.fp32!).toFixed(2)}x`,
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
