/**
 * End-to-end: the server process (the seed ensemble) driven over gRPC on
 * loopback with 1920x1080 JPEGs, against bare ONNX Runtime on the same model
 * in this process, in the same run:
 *  - bare ORT: InferenceSession.run on ready tensors (inference only): the baseline;
 *  - hand-rolled loop: sharp preprocessing + InferenceSession.run, no server: the
 *    compute ceiling of decode + inference on this machine;
 *  - the server, for a few configurations.
 * Throughput: CONCURRENCY requests in flight for SECONDS. Latency: p50 of
 * sequential requests against the preprocess stage's own p50 (same mode, in
 * this process) + bare inference p50 + 2 ms, i.e. the server may add 2 ms.
 * The model is the synthetic ResNet-50 (ResNet-50's real cost) unless
 * BENCH_MODEL=mobilenet picks the shared MobileNetV2 int8.
 * Run: pnpm bench (after pnpm build). Env: BENCH_SECONDS, BENCH_CONCURRENCY, BENCH_LATENCY_N, BENCH_MODEL.
 */
import { copyFile, mkdtemp, readFile } from "node:fs/promises";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createPreprocess } from "@trellis/preprocess";
import { GRPCInferenceService, ModelInferRequestSchema, parseModelConfig } from "@trellis/protocol";
import { bytesTensor, frameBytes, grpcTransport } from "@trellis/stage";
import {
  fixtureImagesDir,
  grpcJsInferenceClient,
  MOBILENET_PATH,
  makeSeedRepository,
  modelsDir,
  removeDir,
  startServerProcess,
} from "@trellis/testing";
import { synthesizeResNet50 } from "@trellis/tooling";
import * as ort from "onnxruntime-node";
import sharp from "sharp";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 8);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
const LATENCY_N = Number(process.env.BENCH_LATENCY_N ?? 40);
const USE_MOBILENET = process.env.BENCH_MODEL === "mobilenet";
const PHOTOS = ["chelsea.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg", "camera.jpg", "motorcycle_left.jpg"];

interface ServerSetup {
  label: string;
  /** Inference's dynamic_batching_strategy (default eager). */
  strategy?: "delay";
  mode: "seed" | "fast";
  /** Inference's instance_group count (models/ has 1). */
  instances?: number;
  /** Inference's intra_op_thread_count parameter (default: the cores split between instances). */
  intraThreads?: number;
  /** Inference's allow_spinning parameter. */
  spinning?: boolean;
  /** Inference's force_spinning_stop parameter. */
  spinStop?: boolean;
}

const ALL_SETUPS: ServerSetup[] = [
  { label: "models/ as committed (preprocess seed, batching eager)", mode: "seed" },
  { label: "preprocess fast, batching eager", mode: "fast" },
  {
    label: "Triton's batching rule (strategy delay: 100 ms max_queue_delay), preprocess seed",
    strategy: "delay",
    mode: "seed",
  },
  { label: "ORT threads spin in a run, stop after, preprocess seed", mode: "seed", spinning: true, spinStop: true },
  { label: "ORT threads spinning, preprocess seed", mode: "seed", spinning: true, spinStop: false },
  { label: "ORT threads not spinning, preprocess seed", mode: "seed", spinning: false },
  { label: "2 inference instances x 1 thread, preprocess seed", mode: "seed", instances: 2 },
  { label: "2 inference instances x 2 threads, preprocess seed", mode: "seed", instances: 2, intraThreads: 2 },
];
/** BENCH_SETUPS=0,3 runs only those rows of ALL_SETUPS. */
const SETUPS = process.env.BENCH_SETUPS
  ? process.env.BENCH_SETUPS.split(",").map((i) => ALL_SETUPS[Number(i)] as ServerSetup)
  : ALL_SETUPS;

const parameter = (key: string, value: string) =>
  `\nparameters {\n  key: "${key}"\n  value: { string_value: "${value}" }\n}\n`;

/** The shared photos as 1920x1080 JPEGs (quality 90), like a camera frame. */
async function fullHdPhotos(): Promise<Uint8Array[]> {
  return Promise.all(
    PHOTOS.map(
      async (p) =>
        new Uint8Array(
          await sharp(join(fixtureImagesDir, p)).resize(1920, 1080, { fit: "cover" }).jpeg({ quality: 90 }).toBuffer(),
        ),
    ),
  );
}

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

/** Completed calls per second with `concurrency` callers looping for `seconds`. */
async function throughput(call: (i: number) => Promise<unknown>, concurrency: number, seconds: number) {
  const end = performance.now() + seconds * 1000;
  let done = 0;
  let next = 0;
  const start = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        await call(next++);
        done++;
      }
    }),
  );
  return done / ((performance.now() - start) / 1000);
}

async function p50(call: (i: number) => Promise<unknown>, n: number): Promise<number> {
  for (let i = 0; i < 3; i++) await call(i);
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await call(i);
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)] as number;
}

/** The preprocess stage's own p50 in this process, per mode. */
async function preprocessP50(photos: Uint8Array[], mode: "seed" | "fast"): Promise<number> {
  const config = parseModelConfig(await readFile(join(modelsDir, "resnet50_preprocess", "config.pbtxt"), "utf8"));
  const stage = await createPreprocess({ config, mode });
  const call = (i: number) => stage.infer({ inputs: [bytesTensor("RAW_IMAGE", [1, 1], [photos[i % photos.length]!])] });
  const t = await p50(call, LATENCY_N);
  await stage.close();
  return t;
}

interface ClientResult {
  client: string;
  rps: number;
  p50: number;
}

/** The server under `setup`, driven by our Connect client and by @grpc/grpc-js (a foreign gRPC client, as Triton's are). */
async function measureServer(model: string, photos: Uint8Array[], setup: ServerSetup): Promise<ClientResult[]> {
  const repo = await makeSeedRepository({
    prefix: "trellis-server-bench-",
    editConfig: (name, text) => {
      let t = text;
      if (name === "resnet50_inference" && setup.strategy) t += parameter("dynamic_batching_strategy", setup.strategy);
      if (name === "resnet50_inference" && setup.instances) t = t.replace(/count: \d+/, `count: ${setup.instances}`);
      if (name === "resnet50_inference" && setup.intraThreads)
        t += parameter("intra_op_thread_count", String(setup.intraThreads));
      if (name === "resnet50_inference" && setup.spinning !== undefined)
        t =
          t.replace(/\nparameters \{\s*key: "allow_spinning"[^}]*\}\s*\}/, "") +
          parameter("allow_spinning", String(setup.spinning));
      if (name === "resnet50_inference" && setup.spinStop !== undefined)
        t += parameter("force_spinning_stop", String(setup.spinStop));
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
    const clients: [string, (i: number) => Promise<unknown>][] = [
      ["Connect", (i) => connect.modelInfer(requests[i % requests.length]!)],
      ["grpc-js", (i) => foreign.modelInfer(foreignRequests[i % foreignRequests.length]!)],
    ];
    const results: ClientResult[] = [];
    for (const [client, call] of clients) {
      for (let i = 0; i < 6; i++) await call(i);
      const rps = await throughput(call, CONCURRENCY, SECONDS);
      results.push({ client, rps, p50: await p50(call, LATENCY_N) });
    }
    return results;
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
  const bareRps = await throughput(inferOnly, CONCURRENCY, SECONDS);
  const loopRps = await throughput(handRolled, CONCURRENCY, SECONDS);
  const inferP50 = await p50(inferOnly, LATENCY_N);
  await session.release();
  const preP50 = { seed: await preprocessP50(photos, "seed"), fast: await preprocessP50(photos, "fast") };

  const rows: string[] = [];
  for (const setup of SETUPS) {
    for (const r of await measureServer(model, photos, setup)) {
      const budget = preP50[setup.mode] + inferP50 + 2;
      rows.push(
        `| ${setup.label} | ${r.client} | ${r.rps.toFixed(1)} img/s | ${(r.rps / bareRps).toFixed(2)}x | ${(r.rps / loopRps).toFixed(2)}x | ${r.p50.toFixed(1)} ms | ${preP50[setup.mode].toFixed(1)} + ${inferP50.toFixed(1)} + 2 = ${budget.toFixed(1)} ms: ${r.p50 <= budget ? `within by ${(budget - r.p50).toFixed(1)} ms` : `over by ${(r.p50 - budget).toFixed(1)} ms`} |`,
      );
    }
  }
  await removeDir(work);

  console.log(
    `\nserver.bench: ${cpus().length} CPUs, ${modelLabel}, ${PHOTOS.length} photos as 1920x1080 JPEG, concurrency ${CONCURRENCY} for ${SECONDS}s, p50 over ${LATENCY_N} sequential requests\n`,
  );
  console.log(`bare ORT (inference only, ready tensors): ${bareRps.toFixed(1)} img/s, p50 ${inferP50.toFixed(1)} ms`);
  console.log(
    `hand-rolled sharp + ORT loop (no server): ${loopRps.toFixed(1)} img/s = ${(loopRps / bareRps).toFixed(2)}x bare`,
  );
  console.log(
    `preprocess stage p50 in-process: seed ${preP50.seed.toFixed(1)} ms, fast ${preP50.fast.toFixed(1)} ms\n`,
  );
  console.log(
    "| server configuration (gRPC, loopback, seed ensemble) | client | throughput | vs bare ORT (target >= 0.85x) | vs hand-rolled loop | p50, concurrency 1 | budget: preprocess + inference + 2 ms |",
  );
  console.log("| --- | --- | --- | --- | --- | --- | --- |");
  for (const r of rows) console.log(r);
}

await main();
