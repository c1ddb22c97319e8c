/**
 * End-to-end: the server process (the seed ensemble) driven over gRPC on
 * loopback with 1920x1080 JPEGs, by our Connect client and by @grpc/grpc-js,
 * against bare ONNX Runtime on the same model in this process:
 *  - bare ORT: InferenceSession.run on ready tensors (inference only): the baseline;
 *  - hand-rolled loop: sharp preprocessing + InferenceSession.run, no server: the
 *    compute ceiling of decode + inference on this machine (a reference, measured once);
 *  - the server, for a few configurations.
 * Each configuration's server is measured in interleaved rounds with bare ORT (and, for
 * latency, the preprocess stage in-process), so its ratio and budget come from the same
 * spell: run-to-run drift on this shared VM is ±2-3 ms per ResNet-50 image.
 * Throughput: CONCURRENCY requests in flight, SECONDS per subject. Latency: p50 of
 * sequential requests against two budgets, each + 2 ms (what the server may add): the
 * preprocess stage's p50 + bare inference p50, each measured alone; and the p50 of the two
 * back to back in this process (preprocess, then ORT on its output, threads spinning only
 * within a run), which runs them with the caches and threads in the state a server's
 * request finds them. A third budget reads "preprocess + inference" as the two models
 * served: the p50 of each called alone through the server (grpc-js), as a client-side
 * pipeline would call them. Two references put the p50 in context: the gRPC floor (grpc-js to
 * a bare node:http2 process that answers at once: the call's cost before any server work)
 * and bare ORT after 10 ms of idle cores; the last column is what the server itself adds
 * beyond preprocess, inference and that floor. The model is the synthetic ResNet-50 (ResNet-50's real
 * cost) unless BENCH_MODEL=mobilenet picks the shared MobileNetV2 int8.
 * Run: pnpm bench (after pnpm build). Env: BENCH_SECONDS, BENCH_ROUNDS, BENCH_CONCURRENCY,
 * BENCH_LATENCY_N, BENCH_WARMUP_SECONDS, BENCH_MODEL, BENCH_SETUPS (e.g. "0,3": only those rows).
 */
import { fork } from "node:child_process";
import { copyFile, mkdtemp, readFile } from "node:fs/promises";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { frameBytes, grpcTransport } from "@trellis/kserve";
import { createPreprocess } from "@trellis/preprocess";
import { GRPCInferenceService, ModelInferRequestSchema, parseModelConfig } from "@trellis/protocol";
import { bytesTensor } from "@trellis/stage";
import {
  closedLoop,
  grpcJsInferenceClient,
  MOBILENET_PATH,
  makeSeedRepository,
  median,
  modelsDir,
  removeDir,
  startServerProcess,
} from "@trellis/testing";
import { synthesizeResNet50 } from "@trellis/tooling";
import * as ort from "onnxruntime-node";
import sharp from "sharp";
import { fullHdPhotos, PHOTOS } from "./photos.js";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 16);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
/** Sequential requests per subject for p50: this VM's p50s move by ±2 ms between runs of 40. */
const LATENCY_N = Number(process.env.BENCH_LATENCY_N ?? 160);
const LATENCY_ROUNDS = 8;
/** Throughput rounds per subject (SECONDS is split between them). */
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 4);
/** Uncounted seconds before each throughput window: the server's decode-then-batch pipeline fills first. */
const WARMUP_SECONDS = Number(process.env.BENCH_WARMUP_SECONDS ?? 1);
const USE_MOBILENET = process.env.BENCH_MODEL === "mobilenet";

interface ServerSetup {
  label: string;
  /** Inference's dynamic_batching_strategy (default eager). */
  strategy?: "delay";
  mode: "seed" | "fast";
  /** Inference's instance_group count (models/ has 1). */
  instances?: number;
  /** Inference's allow_spinning parameter. */
  spinning?: boolean;
  /** Inference's force_spinning_stop parameter. */
  spinStop?: boolean;
  /** Inference's exclusive_cpu parameter (default auto: on with one instance). */
  exclusive?: boolean;
}

const ALL_SETUPS: ServerSetup[] = [
  {
    label:
      "models/ as committed (preprocess seed, batching eager, ORT threads spin within a run, runs hold the CPU alone)",
    mode: "seed",
  },
  { label: "decodes overlapping ORT runs (exclusive_cpu false), preprocess seed", mode: "seed", exclusive: false },
  { label: "preprocess fast, batching eager", mode: "fast" },
  {
    label: "Triton's batching rule (strategy delay: 100 ms max_queue_delay), preprocess seed",
    strategy: "delay",
    mode: "seed",
  },
  { label: "ORT threads spinning on after a run, preprocess seed", mode: "seed", spinning: true, spinStop: false },
  { label: "ORT threads not spinning, preprocess seed", mode: "seed", spinning: false },
  { label: "2 inference instances x 1 thread, preprocess seed", mode: "seed", instances: 2 },
];
/** BENCH_SETUPS=0,3 runs only those rows of ALL_SETUPS. */
const SETUPS = process.env.BENCH_SETUPS
  ? process.env.BENCH_SETUPS.split(",").map((i) => ALL_SETUPS[Number(i)] as ServerSetup)
  : ALL_SETUPS;

const parameter = (key: string, value: string) =>
  `\nparameters {\n  key: "${key}"\n  value: { string_value: "${value}" }\n}\n`;

const MEAN = [0.485, 0.456, 0.406];
const STD = [0.229, 0.224, 0.225];

/** Hand-rolled preprocessing with sharp: short side 256, centre crop 224, ImageNet normalisation, NCHW. */
async function handRolledPreprocess(image: Uint8Array): Promise<Float32Array> {
  const { width = 0, height = 0 } = await sharp(image).metadata();
  const scale = 256 / Math.min(width, height);
  const w = Math.round(width * scale);
  const h = Math.round(height * scale);
  const rgb = await sharp(image)
    .removeAlpha()
    .resize(w, h, { kernel: "linear" })
    .extract({ left: (w - 224) >> 1, top: (h - 224) >> 1, width: 224, height: 224 })
    .raw()
    .toBuffer();
  const out = new Float32Array(3 * 224 * 224);
  const plane = 224 * 224;
  for (let i = 0; i < plane; i++) {
    for (let c = 0; c < 3; c++) out[c * plane + i] = ((rgb[i * 3 + c] as number) / 255 - MEAN[c]!) / STD[c]!;
  }
  return out;
}

/** A call measured in interleaved rounds with others, so a slow spell on a shared machine lands on all alike. */
interface Subject {
  call: (i: number) => Promise<unknown>;
  /** Untimed idle before each latency call (0: back to back). */
  idleMs: number;
  done: number;
  seconds: number;
  /** Calls per second in each throughput round. */
  roundRates: number[];
  latencies: number[];
}

const subject = (call: Subject["call"], idleMs = 0): Subject => ({
  call,
  idleMs,
  done: 0,
  seconds: 0,
  roundRates: [],
  latencies: [],
});
const pause = (ms: number) => new Promise((r) => setTimeout(r, ms));
const rate = (s: Subject) => s.done / s.seconds;

/** The subjects starting from a different one each round, so no subject always follows the same one. */
const rotated = <T>(xs: T[], round: number): T[] => xs.map((_, i) => xs[(i + round) % xs.length]!);

/**
 * Each subject in turn, `rounds` times: `concurrency` callers looping for
 * WARMUP_SECONDS (not counted) then seconds / rounds (counted: calls answered
 * in that window, a steady state for every subject alike).
 */
async function throughput(subjects: Subject[], concurrency: number, seconds: number, rounds = ROUNDS): Promise<void> {
  for (let round = 0; round < rounds; round++) {
    for (const s of rotated(subjects, round)) {
      await pause(50); // the previous subject's threads settle first
      const r = await closedLoop(s.call, concurrency, seconds / rounds, { warmupSeconds: WARMUP_SECONDS });
      s.done += r.calls;
      s.seconds += r.seconds;
      s.roundRates.push(r.calls / r.seconds);
    }
  }
}

/**
 * Each subject in turn, `rounds` times: a warm-up call, then n / rounds
 * sequential timed calls, each after the subject's idleMs (not timed).
 */
async function latency(subjects: Subject[], n: number, rounds = LATENCY_ROUNDS): Promise<void> {
  for (let round = 0; round < rounds; round++) {
    for (const s of rotated(subjects, round)) {
      await pause(50);
      await s.call(round);
      for (let i = 0; i < n / rounds; i++) {
        if (s.idleMs) await pause(s.idleMs);
        const t = performance.now();
        await s.call(i);
        s.latencies.push(performance.now() - t);
      }
    }
  }
}

/**
 * Bare ORT's p50 run back to back against after IDLE_MS with every core idle,
 * in interleaved rounds: what a run costs when the machine has just been idle,
 * as a server's run at concurrency 1 often finds it (a decode keeps one core busy).
 */
const IDLE_MS = 10;
async function idlePenalty(run: (i: number) => Promise<unknown>): Promise<{ backToBack: number; afterIdle: number }> {
  const backToBack = subject(run);
  const afterIdle = subject(run, IDLE_MS);
  await latency([backToBack, afterIdle], 64);
  return { backToBack: median(backToBack.latencies), afterIdle: median(afterIdle.latencies) };
}

/** Idle time between the floor's calls: about what a server call's own work takes at concurrency 1. */
const FLOOR_IDLE_MS = 45;

/**
 * p50 of grpc-js calls (the same 1920x1080 JPEG requests) to grpc-floor.js, a
 * bare node:http2 process answering at once: the gRPC round trip on this
 * machine before any server work, measured with both processes idle between
 * calls, as they are while a server computes a concurrency-1 request.
 */
async function grpcFloor(photos: Uint8Array[], n: number): Promise<number> {
  const child = fork(new URL("./grpc-floor.js", import.meta.url));
  try {
    const { port } = await new Promise<{ port: number }>((resolve, reject) => {
      child.once("message", (m) => resolve(m as { port: number }));
      child.once("exit", (code) => reject(new Error(`grpc-floor exited (${code})`)));
    });
    const client = grpcJsInferenceClient(`127.0.0.1:${port}`);
    const call = (i: number) =>
      client.modelInfer({
        model_name: "resnet50_ensemble",
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
        raw_input_contents: [Buffer.from(frameBytes([photos[i % photos.length]!]))],
      });
    for (let i = 0; i < 6; i++) await call(i);
    const floor = subject(call, FLOOR_IDLE_MS);
    await latency([floor], n);
    client.close();
    return median(floor.latencies);
  } finally {
    child.disconnect();
  }
}

interface ClientResult {
  client: string;
  rps: number;
  p50: number;
  bareRps: number;
  /** This client's rate over bare ORT's in each round (measured back to back). */
  roundRatios: number[];
  inferP50: number;
  preP50: number;
  pipelineP50: number;
  /** p50 of the preprocess and inference models each called alone through the server (grpc-js). */
  stepsP50: { pre: number; infer: number };
}

interface Baseline {
  /** Each photo preprocessed (what the inference model takes). */
  tensors: Float32Array[];
  inferOnly: (i: number) => Promise<unknown>;
  preprocess: Record<"seed" | "fast", (i: number) => Promise<unknown>>;
  /** The preprocess stage in-process, then bare ORT on its output: the two computations back to back, no server. */
  pipeline: Record<"seed" | "fast", (i: number) => Promise<unknown>>;
}

/**
 * The server under `setup`, driven by our Connect client and by @grpc/grpc-js (a foreign
 * gRPC client, as Triton's are), interleaved with bare ORT (throughput and p50) and the
 * preprocess stage in-process (p50), so each row's ratio and budget come from the same spell.
 */
async function measureServer(
  model: string,
  photos: Uint8Array[],
  setup: ServerSetup,
  baseline: Baseline,
): Promise<ClientResult[]> {
  const repo = await makeSeedRepository({
    prefix: "trellis-server-bench-",
    editConfig: (name, text) => {
      let t = text;
      if (name === "resnet50_inference" && setup.strategy) t += parameter("dynamic_batching_strategy", setup.strategy);
      if (name === "resnet50_inference" && setup.instances) t = t.replace(/count: \d+/, `count: ${setup.instances}`);
      if (name === "resnet50_inference" && setup.spinning !== undefined)
        t += parameter("allow_spinning", String(setup.spinning));
      if (name === "resnet50_inference" && setup.spinStop !== undefined)
        t += parameter("force_spinning_stop", String(setup.spinStop));
      if (name === "resnet50_inference" && setup.exclusive !== undefined)
        t += parameter("exclusive_cpu", String(setup.exclusive));
      if (name === "resnet50_preprocess" && setup.mode === "fast") t += parameter("mode", "fast");
      return t;
    },
  });
  await copyFile(model, join(repo, "resnet50_inference", "1", "model.onnx"));
  const server = await startServerProcess(["--model-repository", repo]);
  const transport = grpcTransport(server.grpc);
  const foreign = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
  try {
    const connect = createClient(GRPCInferenceService, transport);
    const requests = photos.map((p) =>
      create(ModelInferRequestSchema, {
        modelName: "resnet50_ensemble",
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [frameBytes([p])],
      }),
    );
    const foreignRequests = photos.map((p) => ({
      model_name: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      raw_input_contents: [Buffer.from(frameBytes([p]))],
    }));
    const bare = subject(baseline.inferOnly);
    const pre = subject(baseline.preprocess[setup.mode]);
    const pipeline = subject(baseline.pipeline[setup.mode]);
    // The ensemble's two costly steps called one after the other through the server: a client-side pipeline.
    const preStep = photos.map((p) => ({
      model_name: "resnet50_preprocess",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      raw_input_contents: [Buffer.from(frameBytes([p]))],
    }));
    const inferStep = baseline.tensors.map((t) => ({
      model_name: "resnet50_inference",
      inputs: [{ name: "input", datatype: "FP32", shape: [1, 3, 224, 224] }],
      raw_input_contents: [Buffer.from(t.buffer, t.byteOffset, t.byteLength)],
    }));
    const preViaServer = subject((i) => foreign.modelInfer(preStep[i % preStep.length]!));
    const inferViaServer = subject((i) => foreign.modelInfer(inferStep[i % inferStep.length]!));
    const clients: [string, Subject][] = [
      ["Connect", subject((i) => connect.modelInfer(requests[i % requests.length]!))],
      ["grpc-js", subject((i) => foreign.modelInfer(foreignRequests[i % foreignRequests.length]!))],
    ];
    for (const [, s] of clients) for (let i = 0; i < 6; i++) await s.call(i);
    await throughput([bare, ...clients.map(([, s]) => s)], CONCURRENCY, SECONDS);
    await latency([bare, pre, pipeline, preViaServer, inferViaServer, ...clients.map(([, s]) => s)], LATENCY_N);
    return clients.map(([client, s]) => ({
      client,
      rps: rate(s),
      roundRatios: s.roundRates.map((r, i) => r / bare.roundRates[i]!),
      p50: median(s.latencies),
      bareRps: rate(bare),
      inferP50: median(bare.latencies),
      preP50: median(pre.latencies),
      pipelineP50: median(pipeline.latencies),
      stepsP50: { pre: median(preViaServer.latencies), infer: median(inferViaServer.latencies) },
    }));
  } finally {
    foreign.close();
    transport.close();
    await server.stop("SIGTERM");
    await removeDir(repo);
  }
}

async function main() {
  const photos = await fullHdPhotos();
  const work = await mkdtemp(join(tmpdir(), "trellis-server-bench-model-"));
  const model = USE_MOBILENET ? MOBILENET_PATH : join(work, "resnet50-synthetic.onnx");
  if (!USE_MOBILENET) await synthesizeResNet50({ path: model });
  const modelLabel = USE_MOBILENET ? "MobileNetV2 int8 (shared)" : "ResNet-50 v1.5 (synthetic weights, real cost)";

  // Bare ORT with ORT's own defaults for a single session: every core intra-op, sequential.
  const session = await ort.InferenceSession.create(model, {
    intraOpNumThreads: cpus().length,
    executionMode: "sequential",
  });
  const bareInfer = (t: Float32Array) =>
    session.run({ [session.inputNames[0] as string]: new ort.Tensor("float32", t, [1, 3, 224, 224]) });
  const tensors = await Promise.all(photos.map(handRolledPreprocess));
  const inferOnly = (i: number) => bareInfer(tensors[i % tensors.length]!);
  const handRolled = async (i: number) => bareInfer(await handRolledPreprocess(photos[i % photos.length]!));
  for (let i = 0; i < 6; i++) await handRolled(i); // warm-up
  const bareRef = subject(inferOnly);
  const loop = subject(handRolled);
  await throughput([bareRef, loop], CONCURRENCY, SECONDS);

  const idle = await idlePenalty(inferOnly);
  const floor = await grpcFloor(photos, LATENCY_N / 2);

  const preprocessConfig = parseModelConfig(
    await readFile(join(modelsDir, "resnet50_preprocess", "config.pbtxt"), "utf8"),
  );
  const seed = await createPreprocess({ config: preprocessConfig, mode: "seed" });
  const fast = await createPreprocess({ config: preprocessConfig, mode: "fast" });
  const preprocessCall = (stage: typeof seed) => (i: number) =>
    stage.infer({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [photos[i % photos.length]!])] });
  // Back to back, ORT's threads must not spin on after a run (with ORT's defaults they do, and
  // starve the next preprocessing): this session spins only within a run, as the server's does.
  const stopping = await ort.InferenceSession.create(model, {
    intraOpNumThreads: cpus().length,
    executionMode: "sequential",
    extra: { session: { force_spinning_stop: "1" } },
  });
  const pipelineCall = (stage: typeof seed) => async (i: number) => {
    const t = (await preprocessCall(stage)(i)).outputs[0]!.data as Float32Array;
    return stopping.run({ [stopping.inputNames[0] as string]: new ort.Tensor("float32", t, [1, 3, 224, 224]) });
  };
  const baseline: Baseline = {
    tensors,
    inferOnly,
    preprocess: { seed: preprocessCall(seed), fast: preprocessCall(fast) },
    pipeline: { seed: pipelineCall(seed), fast: pipelineCall(fast) },
  };

  const rows: string[] = [];
  for (const setup of SETUPS) {
    for (const r of await measureServer(model, photos, setup, baseline)) {
      const verdict = (budget: number) =>
        r.p50 <= budget ? `within by ${(budget - r.p50).toFixed(1)} ms` : `over by ${(r.p50 - budget).toFixed(1)} ms`;
      const parts = r.preP50 + r.inferP50 + 2;
      const backToBack = r.pipelineP50 + 2;
      const added = r.p50 - r.preP50 - r.inferP50 - floor;
      const steps = r.stepsP50.pre + r.stepsP50.infer + 2;
      rows.push(
        `| ${setup.label} | ${r.client} | ${r.rps.toFixed(1)} img/s | ${(r.rps / r.bareRps).toFixed(2)}x (bare ${r.bareRps.toFixed(1)}; rounds ${Math.min(...r.roundRatios).toFixed(2)}-${Math.max(...r.roundRatios).toFixed(2)}) | ${(r.rps / rate(loop)).toFixed(2)}x | ${r.p50.toFixed(1)} ms | ${r.preP50.toFixed(1)} + ${r.inferP50.toFixed(1)} + 2 = ${parts.toFixed(1)} ms: ${verdict(parts)} | ${r.pipelineP50.toFixed(1)} + 2 = ${backToBack.toFixed(1)} ms: ${verdict(backToBack)} | ${r.stepsP50.pre.toFixed(1)} + ${r.stepsP50.infer.toFixed(1)} + 2 = ${steps.toFixed(1)} ms: ${verdict(steps)} | ${added.toFixed(1)} ms |`,
      );
    }
  }
  await Promise.all([seed.close(), fast.close(), session.release(), stopping.release()]);
  await removeDir(work);

  console.log(
    `\nserver.bench: ${cpus().length} CPUs, ${modelLabel}, ${PHOTOS.length} photos as 1920x1080 JPEG; throughput: concurrency ${CONCURRENCY}, ${SECONDS} s per subject in ${ROUNDS} interleaved rounds, each after ${WARMUP_SECONDS} s uncounted; p50: ${LATENCY_N} sequential requests per subject in ${LATENCY_ROUNDS} interleaved rounds\n`,
  );
  console.log(
    `reference: bare ORT ${rate(bareRef).toFixed(1)} img/s; hand-rolled sharp + ORT loop (no server) ${rate(loop).toFixed(1)} img/s = ${(rate(loop) / rate(bareRef)).toFixed(2)}x bare; bare ORT p50 ${idle.backToBack.toFixed(1)} ms back to back, ${idle.afterIdle.toFixed(1)} ms after ${IDLE_MS} ms idle; gRPC floor (grpc-js to a bare node:http2 process answering at once, ${FLOOR_IDLE_MS} ms idle between calls) p50 ${floor.toFixed(1)} ms\n`,
  );
  console.log(
    "| server configuration (gRPC, loopback, seed ensemble) | client | throughput | vs bare ORT, same spell (target >= 0.85x) | vs hand-rolled loop | p50, concurrency 1 | budget: each alone (preprocess p50 + bare inference p50) + 2 ms | budget: back to back (p50 of preprocess then bare inference, in-process) + 2 ms | budget: each step through the server (p50 of resnet50_preprocess, then of resnet50_inference, each called alone over gRPC: a client-side pipeline) + 2 ms | the server's own addition: p50 - preprocess - bare inference - gRPC floor |",
  );
  console.log("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
  for (const r of rows) console.log(r);
}

await main();
