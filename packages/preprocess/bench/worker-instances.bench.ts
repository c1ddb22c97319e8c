/**
 * Preprocess (seed mode) on a 1920x1080 JPEG, 4 requests in flight, one image each:
 * on the main thread as 1 instance (one call at a time, as the model runtime runs an
 * instance), in 1 and 2 worker-thread instances (startWorkerInstances, as config parameter
 * worker_threads "true" loads it), and on the main thread with every call let in at once
 * (the stage interleaves their decodes). Prints requests/s and p50 per run, and the ratio
 * to the main-thread 1-instance run (medians of rounds that interleave the setups, so
 * that other load on the machine falls on each alike).
 *
 *   pnpm --filter @trellis/preprocess build && pnpm --filter @trellis/preprocess bench:workers
 *
 * BENCH_ROUNDS (default 6) rounds of BENCH_SLICE_SECONDS (default 1.5) per setup, after 0.5 s of warm-up each.
 */
import { join } from "node:path";
import { createStage } from "@trellis/preprocess";
import { type ModelConfig, parseModelConfig } from "@trellis/protocol";
import { startWorkerInstances } from "@trellis/runtime";
import { bytesTensor, defineStage, type Stage } from "@trellis/stage";
import { fixtureImagesDir, modelsDir } from "@trellis/testing";
import sharp from "sharp";

const SLICE = Number(process.env.BENCH_SLICE_SECONDS ?? 1.5);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 6);
const CONCURRENCY = 4;

/** One slice: `CONCURRENCY` callers, each sending its next request when the last is answered. */
async function slice(stage: Stage, jpeg: Uint8Array, seconds: number, latencies?: number[]): Promise<number> {
  const request = () => ({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [jpeg])] });
  let answered = 0;
  const start = performance.now();
  const until = start + seconds * 1000;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < until) {
        const t = performance.now();
        await stage.infer(request());
        latencies?.push(performance.now() - t);
        answered++;
      }
    }),
  );
  return answered / ((performance.now() - start) / 1000);
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] ?? Number.NaN;
};

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
  ["main thread, 1 instance", async () => oneAtATime(defineStage(await createStage(factoryOptions)))],
  ["1 worker instance", () => startWorkerInstances({ specifier, factoryOptions, instances: 1 })],
  ["2 worker instances", () => startWorkerInstances({ specifier, factoryOptions, instances: 2 })],
  ["main thread, unbounded", async () => defineStage(await createStage(factoryOptions))],
];
console.log(
  `preprocess seed mode, 1920x1080 JPEG, concurrency ${CONCURRENCY}: ${ROUNDS} rounds of ${SLICE} s per setup, interleaved`,
);
const stages: Stage[] = [];
for (const [, start] of runs) stages.push(await start());
for (const stage of stages) await slice(stage, jpeg, 0.5);
const rates: number[][] = runs.map(() => []);
const latencies: number[][] = runs.map(() => []);
for (let round = 0; round < ROUNDS; round++) {
  for (const [i, stage] of stages.entries()) rates[i]?.push(await slice(stage, jpeg, SLICE, latencies[i]));
}
for (const stage of stages) await stage.close();
const base = median(rates[0] ?? []);
for (const [i, [label]] of runs.entries()) {
  const r = rates[i] ?? [];
  const rps = median(r);
  console.log(
    `${label.padEnd(24)} ${rps.toFixed(1).padStart(6)} req/s (rounds ${Math.min(...r).toFixed(1)}–${Math.max(...r).toFixed(1)})  p50 ${median(
      latencies[i] ?? [],
    )
      .toFixed(1)
      .padStart(6)} ms  ×${(rps / base).toFixed(2)}`,
  );
}
