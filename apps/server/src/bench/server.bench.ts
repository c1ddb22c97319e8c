/**
 * End-to-end: the server process (seed ensemble, shared MobileNetV2 as the
 * inference model) driven over gRPC on loopback with 1920x1080 JPEGs,
 * against bare ONNX Runtime in this process (sharp preprocessing +
 * InferenceSession.run on the same model), in the same run.
 *  - throughput: CONCURRENCY requests in flight for SECONDS, both sides;
 *  - latency at concurrency 1: server p50 vs bare preprocess p50 + inference p50.
 * Run: pnpm bench (after pnpm build). Env: BENCH_SECONDS, BENCH_CONCURRENCY, BENCH_LATENCY_N.
 */
import { spawn } from "node:child_process";
import { copyFile, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { frameBytes } from "@trellis/stage";
import * as ort from "onnxruntime-node";
import sharp from "sharp";

const SECONDS = Number(process.env.BENCH_SECONDS ?? 8);
const CONCURRENCY = Number(process.env.BENCH_CONCURRENCY ?? 8);
const LATENCY_N = Number(process.env.BENCH_LATENCY_N ?? 40);

const root = join(import.meta.dirname, "..", "..", "..", "..");
const shared = join(root, "..", "shared");
const MODEL = join(shared, "models", "mobilenetv2-12-int8.onnx");
const PHOTOS = ["chelsea.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg", "camera.jpg", "motorcycle_left.jpg"];

/**
 * The seed repository; `queueDelayUs` replaces the seed's
 * max_queue_delay_microseconds (100000) when given, `fast` switches
 * preprocess from OpenCV-exact "seed" mode to sharp's fast path.
 */
async function seedRepository(queueDelayUs?: number, fast = false): Promise<string> {
  const repo = await mkdtemp(join(tmpdir(), "trellis-server-bench-"));
  for (const name of (await readdir(join(root, "models"))).filter((n) => n.startsWith("resnet50_"))) {
    await mkdir(join(repo, name, "1"), { recursive: true });
    let config = await readFile(join(root, "models", name, "config.pbtxt"), "utf8");
    if (queueDelayUs !== undefined) {
      config = config.replace(/max_queue_delay_microseconds: \d+/, `max_queue_delay_microseconds: ${queueDelayUs}`);
    }
    if (fast && name === "resnet50_preprocess") {
      config += '\nparameters {\n  key: "mode"\n  value: { string_value: "fast" }\n}\n';
    }
    await writeFile(join(repo, name, "config.pbtxt"), config);
  }
  await copyFile(MODEL, join(repo, "resnet50_inference", "1", "model.onnx"));
  await copyFile(
    join(shared, "models", "imagenet_classes.txt"),
    join(repo, "resnet50_postprocess", "1", "imagenet_classes.txt"),
  );
  return repo;
}

/** The shared photos as 1920x1080 JPEGs (quality 90), like a camera frame. */
async function fullHdPhotos(): Promise<Uint8Array[]> {
  return Promise.all(
    PHOTOS.map(
      async (p) =>
        new Uint8Array(
          await sharp(join(shared, "fixtures", "images", p))
            .resize(1920, 1080, { fit: "cover" })
            .jpeg({ quality: 90 })
            .toBuffer(),
        ),
    ),
  );
}

const MEAN = [0.485, 0.456, 0.406];
const STD = [0.229, 0.224, 0.225];

/** Bare preprocessing with sharp: short side 256, centre crop 224, ImageNet normalisation, NCHW. */
async function barePreprocess(image: Uint8Array): Promise<Float32Array> {
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
  const times: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await call(i);
    times.push(performance.now() - t);
  }
  times.sort((a, b) => a - b);
  return times[Math.floor(times.length / 2)] as number;
}

async function startServer(repo: string) {
  const proc = spawn(
    process.execPath,
    [
      join(import.meta.dirname, "..", "main.js"),
      "--model-repository",
      repo,
      "--http-port",
      "0",
      "--grpc-port",
      "0",
      "--metrics-port",
      "0",
      "--no-fetch-models",
    ],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  let grpcPort = 0;
  await new Promise<void>((resolve, reject) => {
    proc.once("exit", (code) => reject(new Error(`server exited with ${code}`)));
    createInterface({ input: proc.stdout }).on("line", (line) => {
      try {
        const l = JSON.parse(line);
        if (l.msg === "listening" && l.protocol === "grpc") grpcPort = l.port;
        if (l.msg === "server started") resolve();
      } catch {
        // not a log line
      }
    });
  });
  return { proc, url: `http://127.0.0.1:${grpcPort}` };
}

async function main() {
  const photos = await fullHdPhotos();
  const repo = await seedRepository();

  // Bare ORT: same model, same process as its preprocessing.
  const session = await ort.InferenceSession.create(MODEL);
  const bareInfer = (t: Float32Array) =>
    session.run({ [session.inputNames[0] as string]: new ort.Tensor("float32", t, [1, 3, 224, 224]) });
  const bare = async (i: number) => bareInfer(await barePreprocess(photos[i % photos.length] as Uint8Array));
  for (let i = 0; i < 6; i++) await bare(i); // warm-up
  const bareRps = await throughput(bare, CONCURRENCY, SECONDS);
  const tensors = await Promise.all(photos.map(barePreprocess));
  const preP50 = await p50((i) => barePreprocess(photos[i % photos.length] as Uint8Array), LATENCY_N);
  const inferP50 = await p50((i) => bareInfer(tensors[i % tensors.length] as Float32Array), LATENCY_N);
  await session.release();

  await rm(repo, { recursive: true, force: true });

  console.log(
    `\nserver.bench: ${cpus().length} CPUs, ${PHOTOS.length} photos at 1920x1080 JPEG, MobileNetV2 int8, concurrency ${CONCURRENCY} for ${SECONDS}s, p50 over ${LATENCY_N} sequential requests\n`,
  );
  console.log(
    "| configuration | measure | bare ORT (sharp + InferenceSession, in-process) | server (gRPC, loopback, ensemble) | result |",
  );
  console.log("| --- | --- | --- | --- | --- |");
  for (const [label, delay, fast] of [
    ["seed configs (max_queue_delay 100 ms, preprocess mode seed)", undefined, false],
    ["max_queue_delay 0, preprocess mode seed", 0, false],
    ["max_queue_delay 0, preprocess mode fast", 0, true],
  ] as const) {
    const { rps, p50: serverP50 } = await measureServer(photos, delay, fast);
    const budget = preP50 + inferP50 + 2;
    console.log(
      `| ${label} | throughput, concurrency ${CONCURRENCY} | ${bareRps.toFixed(1)} img/s | ${rps.toFixed(1)} img/s | ${(rps / bareRps).toFixed(2)}x bare (target >= 0.85x) |`,
    );
    console.log(
      `| ${label} | p50, concurrency 1 | preprocess ${preP50.toFixed(1)} ms + inference ${inferP50.toFixed(1)} ms = ${(preP50 + inferP50).toFixed(1)} ms | ${serverP50.toFixed(1)} ms | ${serverP50 <= budget ? "within" : "over"} budget ${budget.toFixed(1)} ms |`,
    );
  }
}

async function measureServer(photos: Uint8Array[], queueDelayUs: number | undefined, fast: boolean) {
  const repo = await seedRepository(queueDelayUs, fast);
  const server = await startServer(repo);
  try {
    const client = createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.url }));
    const requests = photos.map((p) =>
      create(ModelInferRequestSchema, {
        modelName: "resnet50_ensemble",
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [frameBytes([p])],
      }),
    );
    const viaServer = (i: number) => client.modelInfer(requests[i % requests.length] as (typeof requests)[number]);
    for (let i = 0; i < 6; i++) await viaServer(i);
    const rps = await throughput(viaServer, CONCURRENCY, SECONDS);
    return { rps, p50: await p50(viaServer, LATENCY_N) };
  } finally {
    server.proc.kill("SIGTERM");
    await new Promise((r) => server.proc.once("exit", r));
    await rm(repo, { recursive: true, force: true });
  }
}

await main();
