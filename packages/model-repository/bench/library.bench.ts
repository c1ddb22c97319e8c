/**
 * Trellis as a library against the same work done by hand: one photo in, its top-5 out.
 *  - bare: sharp (decode, resize the short side to 256 with a cubic kernel, centre crop 224,
 *    RGB) + normalise to CHW float32 in a loop + an onnxruntime-node InferenceSession on the
 *    main thread + softmax and top-5 in a loop. Each photo's crop geometry is computed once,
 *    outside the timing, so the baseline does the least work it can.
 *  - library fast / seed: createPipeline([createPreprocess({ mode }), createOnnxStage({ modelPath }),
 *    createPostprocess({ labelsFile })]) and classify(), as the root README shows. Seed mode
 *    reproduces the seed's OpenCV resize exactly (its known extra cost); fast mode is the
 *    bare loop's resize.
 * fp32 (the shared MobileNetV2 dequantized) and int8 (as shared), one photo at a time and 4 in
 * flight, in interleaved rounds (A B C, C B A, …) so a slow spell on a shared machine falls on
 * every subject. Ratios are against bare, measured in the same round.
 * Run: pnpm bench (after pnpm build), or node dist/bench/library.bench.js in this package.
 * Env: BENCH_SECONDS (per measurement, default 3), BENCH_ROUNDS (default 3), BENCH_WARMUP_SECONDS (0.5).
 */
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createPipeline } from "@trellis/ensemble-runner";
import { createOnnxStage } from "@trellis/inference-onnx";
import { classify, createPostprocess } from "@trellis/postprocess";
import { createPreprocess } from "@trellis/preprocess";
import type { Stage } from "@trellis/stage";
import {
  closedLoop,
  fixturePhotos,
  interleavedRounds,
  LABELS_PATH,
  MOBILENET_PATH,
  median,
  percentile,
  readFixtureImage,
} from "@trellis/testing";
import { dequantizeFile } from "@trellis/tooling";
import * as ort from "onnxruntime-node";
import sharp from "sharp";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 3);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 0.5);
const IN_FLIGHT = [1, 4];
const MEAN = [0.485, 0.456, 0.406];
const STD = [0.229, 0.224, 0.225];

interface Photo {
  bytes: Uint8Array;
  resized: { width: number; height: number };
  left: number;
  top: number;
}

/** Each photo's bytes and crop geometry (short side 256, centre 224), worked out once. */
async function loadPhotos(): Promise<Photo[]> {
  const names = fixturePhotos().filter((p) => p.endsWith(".jpg"));
  return Promise.all(
    names.map(async (name) => {
      const bytes = readFixtureImage(name);
      const meta = await sharp(bytes).autoOrient().metadata();
      const w = meta.autoOrient?.width ?? meta.width!;
      const h = meta.autoOrient?.height ?? meta.height!;
      const resized =
        h < w ? { width: Math.trunc((w * 256) / h), height: 256 } : { width: 256, height: Math.trunc((h * 256) / w) };
      return { bytes, resized, left: (resized.width - 224) >> 1, top: (resized.height - 224) >> 1 };
    }),
  );
}

/** The same work as the pipeline, written by hand. */
function bareClassifier(session: ort.InferenceSession, labels: string[]) {
  return async (photo: Photo): Promise<string[]> => {
    const rgb = await sharp(photo.bytes, { failOn: "truncated" })
      .autoOrient()
      .resize(photo.resized.width, photo.resized.height, { fit: "fill", kernel: "cubic" })
      .extract({ left: photo.left, top: photo.top, width: 224, height: 224 })
      .removeAlpha()
      .raw()
      .toBuffer();
    const plane = 224 * 224;
    const chw = new Float32Array(3 * plane);
    for (let i = 0; i < plane; i++) {
      for (let c = 0; c < 3; c++) chw[c * plane + i] = (rgb[i * 3 + c]! / 255 - MEAN[c]!) / STD[c]!;
    }
    const feeds = { [session.inputNames[0]!]: new ort.Tensor("float32", chw, [1, 3, 224, 224]) };
    const logits = (await session.run(feeds))[session.outputNames[0]!]!.data as Float32Array;
    let max = Number.NEGATIVE_INFINITY;
    for (const v of logits) max = Math.max(max, v);
    const probs = Float32Array.from(logits, (v) => Math.exp(v - max));
    const sum = probs.reduce((a, b) => a + b, 0);
    for (let i = 0; i < probs.length; i++) probs[i]! /= sum;
    const order = Array.from(probs.keys()).sort((a, b) => probs[b]! - probs[a]! || a - b);
    return order.slice(0, 5).map((i) => labels[i]!);
  };
}

async function libraryPipeline(modelPath: string, mode: "fast" | "seed"): Promise<Stage> {
  return createPipeline([
    await createPreprocess({ mode }),
    await createOnnxStage({ modelPath }),
    await createPostprocess({ labelsFile: LABELS_PATH }),
  ]);
}

interface Sample {
  rate: number;
  p50: number;
}

async function main() {
  const work = await mkdtemp(join(tmpdir(), "trellis-library-bench-"));
  try {
    const fp32 = join(work, "mobilenetv2-fp32.onnx");
    await dequantizeFile(MOBILENET_PATH, fp32);
    const models = { fp32, int8: MOBILENET_PATH };
    const photos = await loadPhotos();
    const labels = (await readFile(LABELS_PATH, "utf8")).split("\n");
    console.log(
      `library pipeline vs a bare loop, MobileNetV2 fp32 and int8, ${photos.length} photos, ${ROUNDS} rounds of ${SECONDS} s per subject, interleaved`,
    );
    const rows: string[] = [];
    for (const [precision, modelPath] of Object.entries(models)) {
      const session = await ort.InferenceSession.create(modelPath);
      const bare = bareClassifier(session, labels);
      const fast = await libraryPipeline(modelPath, "fast");
      const seed = await libraryPipeline(modelPath, "seed");
      const subjects: [string, (p: Photo) => Promise<unknown>][] = [
        ["bare", bare],
        ["library fast", (p) => classify(fast, p.bytes)],
        ["library seed", (p) => classify(seed, p.bytes)],
      ];
      // The same answer first: the comparison is only fair if both classify alike.
      const [a, b] = [await bare(photos[0]!), (await classify(fast, photos[0]!.bytes)).labels];
      console.log(`${precision}: bare top-1 ${a[0]}, library fast top-1 ${b[0]}`);
      for (const inFlight of IN_FLIGHT) {
        const samples = new Map<string, Sample[]>(subjects.map(([n]) => [n, []]));
        await interleavedRounds(subjects, ROUNDS, async ([name, call]) => {
          const r = await closedLoop((i) => call(photos[i % photos.length]!), inFlight, SECONDS, {
            warmupSeconds: WARMUP_SECONDS,
          });
          samples.get(name)!.push({ rate: r.calls / r.seconds, p50: percentile(r.latencies, 50) });
        });
        const base = samples.get("bare")!;
        const cell = (name: string) => {
          const s = samples.get(name)!;
          const rate = median(s.map((x) => x.rate));
          const ratios = s.map((x, i) => x.rate / base[i]!.rate);
          const ratio =
            name === "bare"
              ? ""
              : ` (${median(ratios).toFixed(2)}×, rounds ${Math.min(...ratios).toFixed(2)}–${Math.max(...ratios).toFixed(2)})`;
          return `${rate.toFixed(1)}/s p50 ${median(s.map((x) => x.p50)).toFixed(1)} ms${ratio}`;
        };
        rows.push(
          `| ${precision} | ${inFlight} | ${cell("bare")} | ${cell("library fast")} | ${cell("library seed")} |`,
        );
        console.log(rows.at(-1));
      }
      await Promise.all([fast.close(), seed.close(), session.release()]);
    }
    console.log("\n| model | in flight | bare loop | library, fast mode (× bare) | library, seed mode (× bare) |");
    console.log("| --- | --- | --- | --- | --- |");
    for (const row of rows) console.log(row);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

await main();
