/**
 * Bare InferenceSession.run vs the onnxruntime stage, in-process and over
 * gRPC on loopback, at concurrency 1/4/8 with dynamic batching off and on,
 * all in one run. `pnpm bench` (after `pnpm build`); BENCH_SECONDS sets each
 * measurement's length (default 4). Uses the synthetic ResNet-50 from
 * `pnpm models:synth` when models/ has one, else ../shared's MobileNetV2.
 */
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { availableParallelism, cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { parseModelConfig } from "@trellis/protocol";
import { connectStage, grpcTransport, listenStage, type Stage, tensor } from "@trellis/stage";
import * as ort from "onnxruntime-node";
import { createOnnxStage } from "../index.js";

const root = join(import.meta.dirname, "..", "..", "..", "..");
const resnet = join(root, "models", "resnet50_inference", "1", "model.onnx");
const mobilenet = join(root, "..", "shared", "models", "mobilenetv2-12-int8.onnx");
const modelPath = existsSync(resnet) ? resnet : mobilenet;
const modelLabel =
  modelPath === resnet ? "ResNet-50 (models/resnet50_inference, synthetic or fetched)" : "MobileNetV2 int8 (../shared)";
const seconds = Number(process.env.BENCH_SECONDS ?? 4);
const IMAGE = 3 * 224 * 224;
const images = Array.from({ length: 8 }, (_, k) =>
  Float32Array.from({ length: IMAGE }, (_, i) => Math.sin(i * 0.001 + k)),
);

interface Row {
  what: string;
  concurrency: number;
  imgPerS: number;
  p50: number;
  p99: number;
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))] ?? Number.NaN;
};

/** `concurrency` closed-loop clients, each running `call` (items per call) back to back. */
async function measure(
  what: string,
  concurrency: number,
  items: number,
  call: (k: number) => Promise<unknown>,
): Promise<Row> {
  for (let i = 0; i < 2; i++) await call(i); // warm
  const latencies: number[] = [];
  const end = performance.now() + seconds * 1000;
  const t0 = performance.now();
  let done = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async (_, c) => {
      while (performance.now() < end) {
        const t = performance.now();
        await call(c);
        latencies.push(performance.now() - t);
        done += items;
      }
    }),
  );
  const elapsed = (performance.now() - t0) / 1000;
  const row = { what, concurrency, imgPerS: done / elapsed, p50: pct(latencies, 50), p99: pct(latencies, 99) };
  console.error(`${what} c=${concurrency}: ${row.imgPerS.toFixed(1)} img/s, p50 ${row.p50.toFixed(1)} ms`);
  return row;
}

const threads = availableParallelism();
const rows: Row[] = [];

// Bare: one session on this thread, the stage's defaults (all cores intra-op, sequential).
const bare = await ort.InferenceSession.create(modelPath, {
  intraOpNumThreads: threads,
  interOpNumThreads: 1,
  executionMode: "sequential",
});
const bareRun = (n: number) => {
  const data = new Float32Array(n * IMAGE);
  for (let i = 0; i < n; i++) data.set(images[i % 8]!, i * IMAGE);
  return () => bare.run({ input: new ort.Tensor("float32", data, [n, 3, 224, 224]) });
};
const bare1 = bareRun(1);
rows.push(await measure("bare InferenceSession.run, batch 1", 1, 1, bare1));
const bare4 = bareRun(4);
rows.push(await measure("bare InferenceSession.run, batch 4", 1, 4, bare4));
const bare8 = bareRun(8);
rows.push(await measure("bare InferenceSession.run, batch 8", 1, 8, bare8));
await bare.release();

const repo = mkdtempSync(join(tmpdir(), "trellis-onnx-bench-"));
mkdirSync(join(repo, "m", "1"), { recursive: true });
copyFileSync(modelPath, join(repo, "m", "1", "model.onnx"));
const request = (k: number) => ({ inputs: [tensor("input", "FP32", [1, 3, 224, 224], images[k % 8]!)] });

for (const batching of [false, true]) {
  const config = parseModelConfig(`name: "m"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    ${batching ? "dynamic_batching { max_queue_delay_microseconds: 0 }" : ""}`);
  const stage = await createOnnxStage({ config, modelDir: join(repo, "m") });
  const server = await listenStage(stage);
  const remote: Stage = await connectStage(grpcTransport(server.url), "m");
  const label = batching ? "dynamic batching" : "no batching";
  for (const c of [1, 4, 8])
    rows.push(await measure(`stage in-process, ${label}`, c, 1, (k) => stage.infer(request(k))));
  for (const c of [1, 4, 8])
    rows.push(await measure(`stage over gRPC, ${label}`, c, 1, (k) => remote.infer(request(k))));
  await server.close();
  await stage.close();
}
rmSync(repo, { recursive: true, force: true });

const bareBs1 = rows[0]!;
const bestBare = rows.slice(0, 3).reduce((a, b) => (b.imgPerS > a.imgPerS ? b : a));
const stageRows = rows.slice(3);
const best = stageRows.reduce((a, b) => (b.imgPerS > a.imgPerS ? b : a));
const c1 = stageRows.filter((r) => r.concurrency === 1);

console.log(
  `model: ${modelLabel}; ${cpus()[0]?.model ?? "cpu"} × ${threads}; ${seconds} s per row; node ${process.version}, onnxruntime-node ${ort.env.versions.node ?? "1.30"}\n`,
);
console.log("| setup | concurrency | img/s | × bare batch 1 | × best bare | p50 ms | p99 ms |");
console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) {
  console.log(
    `| ${r.what} | ${r.concurrency} | ${r.imgPerS.toFixed(1)} | ${(r.imgPerS / bareBs1.imgPerS).toFixed(2)} | ${(r.imgPerS / bestBare.imgPerS).toFixed(2)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} |`,
  );
}
console.log(
  `\nbest stage: ${best.what}, concurrency ${best.concurrency}: ${best.imgPerS.toFixed(1)} img/s = ${(best.imgPerS / bestBare.imgPerS).toFixed(3)}× best bare (${bestBare.what}, ${bestBare.imgPerS.toFixed(1)} img/s), ${(best.imgPerS / bareBs1.imgPerS).toFixed(3)}× bare batch 1`,
);
for (const r of c1) {
  console.log(
    `p50 at concurrency 1, ${r.what}: ${r.p50.toFixed(2)} ms vs bare ${bareBs1.p50.toFixed(2)} ms (${r.p50 - bareBs1.p50 >= 0 ? "+" : ""}${(r.p50 - bareBs1.p50).toFixed(2)} ms)`,
  );
}
