/**
 * Bare InferenceSession.run vs the onnxruntime stage, in-process and over
 * gRPC on loopback, at concurrency 1/4/8 with dynamic batching off and on,
 * all in one run, against bare sessions with and without ORT's thread
 * spinning (the stage's default spins during a run and stops after it). `pnpm bench` (after `pnpm
 * build`); BENCH_SECONDS sets each row's counted length (default 8), split over
 * BENCH_ROUNDS interleaved rounds (default 4), each after BENCH_WARMUP_SECONDS
 * (default 0.5) uncounted. Uses the synthetic ResNet-50
 * from `pnpm models:synth` when models/ has one, else the bundled MobileNetV2 (tooling/bundled).
 */
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { availableParallelism, cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { listenStage } from "@trellis/frontends";
import { createOnnxModel, type OnnxStageOptions } from "@trellis/inference-onnx";
import { connectStage, grpcTransport } from "@trellis/kserve";
import { parseModelConfig } from "@trellis/protocol";
import { createModel } from "@trellis/runtime";
import { type Stage, tensor } from "@trellis/stage";
import { closedLoop, percentile } from "@trellis/testing";
import * as ort from "onnxruntime-node";

/** The model served by the model runtime, as the repository loader serves it. */
async function createOnnxStage(options: OnnxStageOptions) {
  const model = await createOnnxModel(options);
  return createModel({ config: model.config, backend: model.backend, strategy: model.strategy });
}

const root = join(import.meta.dirname, "..", "..", "..", "..");
const resnet = join(root, "models", "resnet50_inference", "1", "model.onnx");
const mobilenet = join(root, "tooling", "bundled", "mobilenetv2-12-int8.onnx");
const modelPath = existsSync(resnet) ? resnet : mobilenet;
const modelLabel =
  modelPath === resnet
    ? "ResNet-50 (models/resnet50_inference, synthetic or fetched)"
    : "MobileNetV2 int8 (tooling/bundled)";
const seconds = Number(process.env.BENCH_SECONDS ?? 8);
/** Interleaved rounds each row's time is split into (BENCH_ROUNDS). */
const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 4));
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

/** One row of the table: closed-loop clients running `call` (items per call) back to back. */
interface Cell {
  what: string;
  concurrency: number;
  items: number;
  call: (k: number) => Promise<unknown>;
  latencies: number[];
  done: number;
  seconds: number;
}

/** Uncounted seconds before each slice: a batching stage's queue and batches fill up first. */
const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 0.5);

/** Runs a cell for `slice` seconds more (calls answered in that window), after an uncounted warm-up. */
async function measure(cell: Cell, slice: number): Promise<void> {
  const r = await closedLoop(cell.call, cell.concurrency, slice, { warmupSeconds: WARMUP_SECONDS });
  for (const l of r.latencies) cell.latencies.push(l);
  cell.done += r.calls * cell.items;
  cell.seconds += r.seconds;
}

const threads = availableParallelism();
const cells: Cell[] = [];
const cell = (what: string, concurrency: number, items: number, call: Cell["call"]) =>
  cells.push({ what, concurrency, items, call, latencies: [], done: 0, seconds: 0 });
const closers: (() => Promise<unknown>)[] = [];

// Bare: one session on this thread, all cores intra-op, sequential; once with ORT's default
// thread spinning, once without (as the stage with allow_spinning false): the stage's
// own overhead is its gap to the bare session with the nearest options.
const NO_SPIN = { session: { intra_op: { allow_spinning: "0" }, inter_op: { allow_spinning: "0" } } };
for (const spin of [true, false]) {
  const bare = await ort.InferenceSession.create(modelPath, {
    intraOpNumThreads: threads,
    interOpNumThreads: 1,
    executionMode: "sequential",
    ...(spin ? {} : { extra: NO_SPIN }),
  });
  closers.push(() => bare.release());
  for (const n of [1, 4, 8]) {
    const data = new Float32Array(n * IMAGE);
    for (let i = 0; i < n; i++) data.set(images[i % 8]!, i * IMAGE);
    const label = `bare InferenceSession.run${spin ? "" : " (no spinning)"}, batch ${n}`;
    cell(label, 1, n, () => bare.run({ input: new ort.Tensor("float32", data, [n, 3, 224, 224]) }));
  }
}
const bareCells = cells.length;

const repo = mkdtempSync(join(tmpdir(), "trellis-onnx-bench-"));
mkdirSync(join(repo, "m", "1"), { recursive: true });
copyFileSync(modelPath, join(repo, "m", "1", "model.onnx"));
const request = (k: number) => ({ inputs: [tensor("input", "FP32", [1, 3, 224, 224], images[k % 8]!)] });

// Batching "eager" (max_queue_delay 0, where Triton's rule, the default, agrees): an idle instance takes what is
// queued, so 8 closed-loop clients settle into alternating batches of 1 and 7. "delay":
// Triton's rule with preferred_batch_size 8 and a 2 ms delay, so they form batches of 8.
type Batching = "none" | "eager" | "delay";
const BATCHING: Record<Batching, string> = {
  none: "",
  eager: "dynamic_batching { max_queue_delay_microseconds: 0 }",
  delay: `dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 2000 }
    parameters { key: "dynamic_batching_strategy" value { string_value: "delay" } }`,
};
const LABEL: Record<Batching, string> = {
  none: "no batching",
  eager: "dynamic batching",
  delay: "dynamic batching, delay strategy, preferred 8",
};
const stageConfig = (batching: Batching, noSpin: boolean) =>
  parseModelConfig(`name: "m"
    platform: "onnxruntime_onnx"
    max_batch_size: 8
    ${BATCHING[batching]}
    ${noSpin ? 'parameters { key: "allow_spinning" value { string_value: "false" } }' : ""}`);
for (const batching of ["none", "eager"] as const) {
  const stage = await createOnnxStage({ config: stageConfig(batching, false), modelDir: join(repo, "m") });
  const server = await listenStage(stage);
  const remote: Stage = await connectStage(grpcTransport(server.url), "m");
  closers.push(
    () => server.close(),
    () => stage.close(),
  );
  const label = LABEL[batching];
  for (const c of [1, 4, 8]) cell(`stage in-process, ${label}`, c, 1, (k) => stage.infer(request(k)));
  for (const c of [1, 4, 8]) cell(`stage over gRPC, ${label}`, c, 1, (k) => remote.infer(request(k)));
}
// In-process only: the delay strategy, and the stage again with allow_spinning "false"
// (as the second bare session).
const extra: [Batching, boolean, number[]][] = [
  ["delay", false, [8]],
  ["none", true, [1]],
  ["eager", true, [8]],
  ["delay", true, [8]],
];
for (const [batching, noSpin, concurrencies] of extra) {
  const stage = await createOnnxStage({ config: stageConfig(batching, noSpin), modelDir: join(repo, "m") });
  closers.push(() => stage.close());
  const label = `stage in-process, ${noSpin ? "no spinning, " : ""}${LABEL[batching]}`;
  for (const c of concurrencies) cell(label, c, 1, (k) => stage.infer(request(k)));
}

// Every setup is loaded before any is timed, and the cells run in ROUNDS interleaved rounds,
// so a slow spell on a shared machine spreads over all rows instead of skewing a few.
for (let round = 0; round < ROUNDS; round++) {
  for (const c of cells) {
    await measure(c, seconds / ROUNDS);
    if (round === ROUNDS - 1) {
      console.error(`${c.what} c=${c.concurrency}: ${(c.done / c.seconds).toFixed(1)} img/s`);
    }
  }
}
for (const close of closers.reverse()) await close();
rmSync(repo, { recursive: true, force: true });

const rows: Row[] = cells.map((c) => ({
  what: c.what,
  concurrency: c.concurrency,
  imgPerS: c.done / c.seconds,
  p50: percentile(c.latencies, 50),
  p99: percentile(c.latencies, 99),
}));
const bareRows = rows.slice(0, bareCells);
const fastest = (xs: Row[]) => xs.reduce((a, b) => (b.imgPerS > a.imgPerS ? b : a));
const bareSpin = bareRows.slice(0, 3);
const bareNoSpin = bareRows.slice(3);
const bareBs1 = bareSpin[0]!;
const bestBare = fastest(bareRows);
const stageRows = rows.slice(bareRows.length);
const noSpinRows = stageRows.filter((r) => r.what.includes("no spinning"));
const defaultRows = stageRows.filter((r) => !r.what.includes("no spinning"));

console.log(
  `model: ${modelLabel}; ${cpus()[0]?.model ?? "cpu"} × ${threads}; ${seconds} s per row in ${ROUNDS} interleaved rounds, each after ${WARMUP_SECONDS} s uncounted; node ${process.version}, onnxruntime-node ${ort.env.versions.node ?? "1.30"}\n`,
);
console.log("| setup | concurrency | img/s | × bare batch 1 | × best bare | p50 ms | p99 ms |");
console.log("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
for (const r of rows) {
  console.log(
    `| ${r.what} | ${r.concurrency} | ${r.imgPerS.toFixed(1)} | ${(r.imgPerS / bareBs1.imgPerS).toFixed(2)} | ${(r.imgPerS / bestBare.imgPerS).toFixed(2)} | ${r.p50.toFixed(1)} | ${r.p99.toFixed(1)} |`,
  );
}
const signed = (x: number) => `${x >= 0 ? "+" : ""}${x.toFixed(2)}`;
console.log("");
for (const [label, stageSet, bareSet] of [
  ["stage defaults (spinning within a run) vs bare with ORT's defaults", defaultRows, bareSpin],
  ["stage defaults (spinning within a run) vs bare without spinning", defaultRows, bareNoSpin],
  ["stage allow_spinning false vs bare without spinning", noSpinRows, bareNoSpin],
] as const) {
  const best = fastest([...stageSet]);
  const bestB = fastest([...bareSet]);
  const b1 = bareSet[0]!;
  console.log(
    `${label}: best ${best.what} c=${best.concurrency} ${best.imgPerS.toFixed(1)} img/s = ${(best.imgPerS / bestB.imgPerS).toFixed(3)}× best bare (${bestB.what}, ${bestB.imgPerS.toFixed(1)} img/s)`,
  );
  for (const r of stageSet.filter((x) => x.concurrency === 1)) {
    console.log(
      `  p50 at concurrency 1, ${r.what}: ${r.p50.toFixed(2)} ms vs ${b1.what} ${b1.p50.toFixed(2)} ms (${signed(r.p50 - b1.p50)} ms)`,
    );
  }
}
