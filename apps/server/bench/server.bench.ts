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
 * The int8 row (issue 23) serves the seed repository with the model's QDQ int8 version from the
 * project's quantizer (`quantizeFile`, as `models:quantize --version 2 --reduce-range`, calibrated
 * on four fixture photos; BENCH_INT8_MODEL=FILE takes a ready one) as resnet50_inference version 2,
 * and measures it against the fp32 ensemble (a second server with version 1 only), in interleaved
 * rounds with bare ORT on both models.
 * Run: pnpm bench (after pnpm build). Env: BENCH_SECONDS, BENCH_ROUNDS, BENCH_CONCURRENCY,
 * BENCH_LATENCY_N, BENCH_WARMUP_SECONDS, BENCH_MODEL, BENCH_SETUPS (e.g. "0,3": only those rows),
 * BENCH_INT8_MODEL.
 */
import { fork } from "node:child_process";
import { copyFile, mkdir, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { grpcTransport } from "@trellis/kserve";
import { frameBytes } from "@trellis/kserve/wire";
import { createPreprocess } from "@trellis/preprocess";
import { GRPCInferenceService, ModelInferRequestSchema, parseModelConfig } from "@trellis/protocol";
import { bytesTensor } from "@trellis/stage";
import {
  closedLoop,
  fixtureImagesDir,
  grpcJsInferenceClient,
  MOBILENET_PATH,
  makeSeedRepository,
  median,
  modelsDir,
  removeDir,
  startServerProcess,
} from "@trellis/testing";
import { quantizeFile, synthesizeResNet50 } from "@trellis/tooling";
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
  /** The int8 row: version 2 = the model quantized, against the fp32 ensemble (its own table). */
  int8?: boolean;
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
  {
    label: "int8: resnet50_inference version 2 = the model quantized (QDQ), models/ as committed",
    mode: "seed",
    int8: true,
  },
];
/** BENCH_SETUPS=0,3 runs only those rows of ALL_SETUPS. */
const SETUPS = process.env.BENCH_SETUPS
  ? process.env.BENCH_SETUPS.split(",").map((i) => {
      const setup = ALL_SETUPS[Number(i)];
      if (!setup) throw new Error(`BENCH_SETUPS: no row ${i} (0-${ALL_SETUPS.length - 1})`);
      return setup;
    })
  : ALL_SETUPS;
/** The int8 row's model: a ready QDQ file, else quantized from the bench's fp32 model at the start. */
const INT8_MODEL = process.env.BENCH_INT8_MODEL;
/** Calibration photos for the int8 row's quantization: fixture files at their own size, not the requests. */
const INT8_CALIBRATION = ["horse.jpg", "chelsea.png", "coffee.png", "astronaut.jpg"];

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

/** One seed-ensemble request per photo, for our Connect client and for grpc-js. */
function ensembleRequests(photos: Uint8Array[]) {
  return {
    requests: photos.map((p) =>
      create(ModelInferRequestSchema, {
        modelName: "resnet50_ensemble",
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [frameBytes([p])],
      }),
    ),
    foreignRequests: photos.map((p) => ({
      model_name: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      raw_input_contents: [Buffer.from(frameBytes([p]))],
    })),
  };
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
    const { requests, foreignRequests } = ensembleRequests(photos);
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

interface Int8Result {
  client: string;
  fp32Rps: number;
  int8Rps: number;
  /** int8 rate over fp32's in each round (measured one after the other). */
  roundRatios: number[];
  fp32P50: number;
  int8P50: number;
}

interface Int8Bare {
  fp32Rps: number;
  int8Rps: number;
  roundRatios: number[];
  fp32P50: number;
  int8P50: number;
}

/** A temp seed repository with `versions` as resnet50_inference's version folders (1, 2, ...); configs as committed. */
async function seedRepositoryWith(versions: string[]): Promise<string> {
  const repo = await makeSeedRepository({ prefix: "trellis-server-bench-" });
  for (const [i, file] of versions.entries()) {
    const dir = join(repo, "resnet50_inference", String(i + 1));
    await mkdir(dir, { recursive: true });
    await copyFile(file, join(dir, "model.onnx"));
  }
  return repo;
}

/**
 * The int8 row: the seed ensemble served from a repository holding the fp32 model as version 1
 * and the int8 one as version 2 (the server serves the latest: 2), against the same ensemble from
 * a repository with version 1 only, each server idle while the other is measured; interleaved
 * rounds with bare ORT on each model (throughput and p50), so the ratios come from the same spell.
 */
async function measureInt8(
  model: string,
  int8Model: string,
  photos: Uint8Array[],
  baseline: Baseline,
  bareInt8: (i: number) => Promise<unknown>,
): Promise<{ clients: Int8Result[]; bare: Int8Bare }> {
  const fp32Repo = await seedRepositoryWith([model]);
  const int8Repo = await seedRepositoryWith([model, int8Model]);
  const fp32Server = await startServerProcess(["--model-repository", fp32Repo]);
  const int8Server = await startServerProcess(["--model-repository", int8Repo]);
  const transports = [grpcTransport(fp32Server.grpc), grpcTransport(int8Server.grpc)];
  const foreign = [fp32Server, int8Server].map((s) => grpcJsInferenceClient(`127.0.0.1:${s.grpcPort}`));
  try {
    const meta = (await (await fetch(`${int8Server.http}/v2/models/resnet50_inference`)).json()) as {
      versions: string[];
    };
    if (meta.versions.join() !== "2") throw new Error(`int8 repository serves versions ${meta.versions}, not 2`);
    const { requests, foreignRequests } = ensembleRequests(photos);
    const bareFp32 = subject(baseline.inferOnly);
    const bareQ = subject(bareInt8);
    // [client, fp32 subject, int8 subject]
    const clients: [string, Subject, Subject][] = [
      [
        "Connect",
        ...(transports.map((t) => {
          const c = createClient(GRPCInferenceService, t);
          return subject((i) => c.modelInfer(requests[i % requests.length]!));
        }) as [Subject, Subject]),
      ],
      [
        "grpc-js",
        ...(foreign.map((c) => subject((i) => c.modelInfer(foreignRequests[i % foreignRequests.length]!))) as [
          Subject,
          Subject,
        ]),
      ],
    ];
    const servers = clients.flatMap(([, f, q]) => [f, q]);
    for (const s of servers) for (let i = 0; i < 6; i++) await s.call(i);
    await throughput([bareFp32, bareQ, ...servers], CONCURRENCY, SECONDS);
    await latency([bareFp32, bareQ, ...servers], LATENCY_N);
    const ratios = (f: Subject, q: Subject) => q.roundRates.map((r, i) => r / f.roundRates[i]!);
    return {
      clients: clients.map(([client, f, q]) => ({
        client,
        fp32Rps: rate(f),
        int8Rps: rate(q),
        roundRatios: ratios(f, q),
        fp32P50: median(f.latencies),
        int8P50: median(q.latencies),
      })),
      bare: {
        fp32Rps: rate(bareFp32),
        int8Rps: rate(bareQ),
        roundRatios: ratios(bareFp32, bareQ),
        fp32P50: median(bareFp32.latencies),
        int8P50: median(bareQ.latencies),
      },
    };
  } finally {
    for (const c of foreign) c.close();
    for (const t of transports) t.close();
    await Promise.all([fp32Server.stop("SIGTERM"), int8Server.stop("SIGTERM")]);
    await Promise.all([removeDir(fp32Repo), removeDir(int8Repo)]);
  }
}

/** The int8 row's model: BENCH_INT8_MODEL, or `model` quantized into `work` (as models:quantize --reduce-range). */
async function int8ModelFor(model: string, work: string): Promise<{ path: string; label: string }> {
  if (INT8_MODEL) return { path: INT8_MODEL, label: `BENCH_INT8_MODEL=${INT8_MODEL}` };
  if (USE_MOBILENET)
    throw new Error("the int8 row quantizes the synthetic ResNet-50; with BENCH_MODEL=mobilenet set BENCH_INT8_MODEL");
  const list = join(work, "calibration.txt");
  await writeFile(list, INT8_CALIBRATION.map((p) => join(fixtureImagesDir, p)).join("\n"));
  const path = join(work, "resnet50-int8.onnx");
  const t0 = performance.now();
  const report = await quantizeFile({ model, calibration: list, out: path, reduceRange: true });
  const kernels = Object.entries(report.ortOptimizedOps)
    .filter(([op]) => /QLinear/.test(op))
    .map(([op, n]) => `${n} ${op.replace("com.microsoft:", "")}`)
    .join(", ");
  return {
    path,
    label: `quantized here in ${((performance.now() - t0) / 1000).toFixed(1)} s (percentile 99.99, --reduce-range, ${report.calibrationImages.length} fixture photos; ORT runs ${kernels})`,
  };
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

  const int8Setup = SETUPS.find((s) => s.int8);
  const int8 = int8Setup ? await int8ModelFor(model, work) : undefined;
  const int8Session = int8
    ? await ort.InferenceSession.create(int8.path, { intraOpNumThreads: cpus().length, executionMode: "sequential" })
    : undefined;
  const bareInt8 = (i: number) =>
    int8Session!.run({
      [int8Session!.inputNames[0] as string]: new ort.Tensor("float32", tensors[i % tensors.length]!, [1, 3, 224, 224]),
    });

  const rows: string[] = [];
  const int8Rows: string[] = [];
  let int8Bare: Int8Bare | undefined;
  for (const setup of SETUPS) {
    if (setup.int8) {
      const r = await measureInt8(model, int8!.path, photos, baseline, bareInt8);
      int8Bare = r.bare;
      for (const c of r.clients) {
        int8Rows.push(
          `| ${setup.label} | ${c.client} | ${c.fp32Rps.toFixed(1)} img/s | ${c.int8Rps.toFixed(1)} img/s | ${(c.int8Rps / c.fp32Rps).toFixed(2)}x (rounds ${Math.min(...c.roundRatios).toFixed(2)}-${Math.max(...c.roundRatios).toFixed(2)}) | ${c.fp32P50.toFixed(1)} ms | ${c.int8P50.toFixed(1)} ms |`,
        );
      }
      continue;
    }
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
  await Promise.all([seed.close(), fast.close(), session.release(), stopping.release(), int8Session?.release()]);
  await removeDir(work);

  console.log(
    `\nserver.bench: ${cpus().length} CPUs, ${modelLabel}, ${PHOTOS.length} photos as 1920x1080 JPEG; throughput: concurrency ${CONCURRENCY}, ${SECONDS} s per subject in ${ROUNDS} interleaved rounds, each after ${WARMUP_SECONDS} s uncounted; p50: ${LATENCY_N} sequential requests per subject in ${LATENCY_ROUNDS} interleaved rounds\n`,
  );
  console.log(
    `reference: bare ORT ${rate(bareRef).toFixed(1)} img/s; hand-rolled sharp + ORT loop (no server) ${rate(loop).toFixed(1)} img/s = ${(rate(loop) / rate(bareRef)).toFixed(2)}x bare; bare ORT p50 ${idle.backToBack.toFixed(1)} ms back to back, ${idle.afterIdle.toFixed(1)} ms after ${IDLE_MS} ms idle; gRPC floor (grpc-js to a bare node:http2 process answering at once, ${FLOOR_IDLE_MS} ms idle between calls) p50 ${floor.toFixed(1)} ms\n`,
  );
  if (rows.length > 0) printRows(rows);
  if (int8 && int8Bare) {
    const b = int8Bare;
    console.log(
      `\nint8 (issue 23): ${int8.label}\nbare ORT, same rounds: fp32 ${b.fp32Rps.toFixed(1)} img/s, int8 ${b.int8Rps.toFixed(1)} img/s = ${(b.int8Rps / b.fp32Rps).toFixed(2)}x (rounds ${Math.min(...b.roundRatios).toFixed(2)}-${Math.max(...b.roundRatios).toFixed(2)}); p50 fp32 ${b.fp32P50.toFixed(1)} ms, int8 ${b.int8P50.toFixed(1)} ms\n`,
    );
    console.log(
      "| server configuration (gRPC, loopback, seed ensemble, 1920x1080 JPEG, preprocess seed) | client | fp32 ensemble (version 1 only) | int8 ensemble (version 2 served) | int8 vs fp32, same rounds (target >= 1.8x) | p50 fp32, concurrency 1 | p50 int8, concurrency 1 |",
    );
    console.log("| --- | --- | --- | --- | --- | --- | --- |");
    for (const r of int8Rows) console.log(r);
  }
}

function printRows(rows: string[]): void {
  console.log(
    "| server configuration (gRPC, loopback, seed ensemble) | client | throughput | vs bare ORT, same spell (target >= 0.85x) | vs hand-rolled loop | p50, concurrency 1 | budget: each alone (preprocess p50 + bare inference p50) + 2 ms | budget: back to back (p50 of preprocess then bare inference, in-process) + 2 ms | budget: each step through the server (p50 of resnet50_preprocess, then of resnet50_inference, each called alone over gRPC: a client-side pipeline) + 2 ms | the server's own addition: p50 - preprocess - bare inference - gRPC floor |",
  );
  console.log("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
  for (const r of rows) console.log(r);
}

await main();
