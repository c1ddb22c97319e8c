/**
 * Preprocess (seed mode) on a 1920x1080 JPEG, 4 requests in flight, one image each:
 * on the main thread as 1 instance (one call at a time, as the model runtime runs an
 * instance), in 1 and 2 worker-thread instances (startWorkerInstances, as config parameter
 * worker_threads "true" loads it), and on the main thread with every call let in at once
 * (the stage interleaves their decodes). Prints requests/s and p50 per run, and the ratio
 * to the main-thread 1-instance run.
 *
 *   pnpm --filter @trellis/preprocess build && pnpm --filter @trellis/preprocess bench:workers
 *
 * BENCH_SECONDS (default 4) per run after 1 s of warm-up; BENCH_ROUNDS (default 1) repeats the set.
 */
import { join } from "node:path";
import { createStage } from "@trellis/preprocess";
import { type ModelConfig, parseModelConfig } from "@trellis/protocol";
import { startWorkerInstances } from "@trellis/runtime";
import { bytesTensor, type Stage } from "@trellis/stage";
import { fixtureImagesDir, modelsDir } from "@trellis/testing";
import sharp from "sharp";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 4);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 1);
const CONCURRENCY = 4;

interface Result {
  rps: number;
  p50: number;
}

async function measure(stage: Stage, jpeg: Uint8Array): Promise<Result> {
  const request = () => ({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [jpeg])] });
  const run = async (until: number, latencies?: number[]) => {
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (performance.now() < until) {
          const t = performance.now();
          await stage.infer(request());
          latencies?.push(performance.now() - t);
        }
      }),
    );
  };
  await run(performance.now() + 1000);
  const latencies: number[] = [];
  const start = performance.now();
  await run(start + SECONDS * 1000, latencies);
  const elapsed = (performance.now() - start) / 1000;
  latencies.sort((a, b) => a - b);
  return { rps: latencies.length / elapsed, p50: latencies[Math.floor(latencies.length / 2)] ?? Number.NaN };
}

const config: ModelConfig = parseModelConfig(
  `name: "resnet50_preprocess"
backend: "typescript"
max_batch_size: 256
input [ { name: "RAW_IMAGE" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "PREPROCESSED_IMAGE" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
parameters { key: "mode" value: { string_value: "seed" } }`,
);
const modelDir = join(modelsDir, "resnet50_preprocess");
const factoryOptions = { config, modelDir, version: "1", versionDir: join(modelDir, "1") };
const specifier = import.meta.resolve("@trellis/preprocess");

const jpeg = new Uint8Array(
  await sharp(join(fixtureImagesDir, "chelsea.jpg"))
    .resize(1920, 1080, { fit: "cover" })
    .jpeg({ quality: 90 })
    .toBuffer(),
);

/** `stage` as one instance: one call at a time, the others waiting in order. */
function oneAtATime(stage: Stage): Stage {
  let last: Promise<unknown> = Promise.resolve();
  return {
    ...stage,
    infer(request, options) {
      const answer = last.then(() => stage.infer(request, options));
      last = answer.catch(() => {});
      return answer;
    },
  };
}

const runs: [string, () => Promise<Stage>][] = [
  ["main thread, 1 instance", async () => oneAtATime(createStage(factoryOptions))],
  ["1 worker instance", () => startWorkerInstances({ specifier, factoryOptions, instances: 1 })],
  ["2 worker instances", () => startWorkerInstances({ specifier, factoryOptions, instances: 2 })],
  ["main thread, unbounded", async () => createStage(factoryOptions)],
];
console.log(`preprocess seed mode, 1920x1080 JPEG, concurrency ${CONCURRENCY}, ${SECONDS} s per run`);
for (let round = 1; round <= ROUNDS; round++) {
  const results: Result[] = [];
  for (const [label, start] of runs) {
    const stage = await start();
    const r = await measure(stage, jpeg);
    await stage.close();
    results.push(r);
    const base = results[0] ?? r;
    console.log(
      `round ${round}  ${label.padEnd(24)} ${r.rps.toFixed(1).padStart(6)} req/s  p50 ${r.p50.toFixed(1).padStart(6)} ms  ×${(r.rps / base.rps).toFixed(2)} vs main 1 instance`,
    );
  }
}
