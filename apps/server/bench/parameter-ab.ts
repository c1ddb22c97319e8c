/**
 * A/B of one model parameter (docs/bench-history.md; @trellis/inference-onnx's README,
 * "CPU time-sharing"): two servers side by side on the seed repository, A with the configs as
 * committed, B with AB_PARAMETER (default `exclusive_cpu=false`) added to AB_MODEL's config
 * (default resnet50_inference). Measured in interleaved rounds, the order alternating, each
 * server idle while the other runs: AB_CONCURRENCY (8) grpc-js callers of 1920x1080 JPEGs for
 * AB_SECONDS (10) after 2 s of warm-up, then AB_LATENCY_N (40) calls one at a time for the p50.
 * Reported: req/s and p50 per round, and A/B throughput per round (the config as committed over the parameter) with its median. The model is
 * the synthetic ResNet-50 (ResNet-50's cost), or the shared MobileNetV2 with BENCH_MODEL=mobilenet.
 * Run (after pnpm build): node --enable-source-maps dist/bench/parameter-ab.js
 */
import { join } from "node:path";
import {
  grpcJsInferenceClient,
  makeSeedRepository,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { synthesizeResNet50 } from "@trellis/tooling";
import { fullHdPhotos } from "./photos.js";
import { measureRounds, printRounds, type RoundSubject } from "./rounds.js";

const [KEY, VALUE] = (process.env.AB_PARAMETER ?? "exclusive_cpu=false").split("=") as [string, string];
const MODEL = process.env.AB_MODEL ?? "resnet50_inference";
const SECONDS = Number(process.env.AB_SECONDS ?? 10);
const ROUNDS = Number(process.env.AB_ROUNDS ?? 4);
const CONCURRENCY = Number(process.env.AB_CONCURRENCY ?? 8);
const LATENCY_N = Number(process.env.AB_LATENCY_N ?? 40);

const parameter = (key: string, value: string) =>
  `\nparameters { key: "${key}" value: { string_value: "${value}" } }\n`;

async function repository(edit: boolean): Promise<string> {
  const repo = await makeSeedRepository({
    prefix: "trellis-parameter-ab-",
    editConfig: (name, text) => (edit && name === MODEL ? text + parameter(KEY, VALUE) : text),
  });
  if (process.env.BENCH_MODEL !== "mobilenet")
    await synthesizeResNet50({ seed: 7, path: join(repo, "resnet50_inference", "1", "model.onnx") });
  return repo;
}

interface Subject extends RoundSubject {
  repo: string;
  server: ServerProcess;
  close: () => void;
}

async function subject(label: string, edit: boolean): Promise<Subject> {
  const repo = await repository(edit);
  const server = await startServerProcess(["--model-repository", repo]);
  const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
  const infer = (photo: Uint8Array) => {
    const length = Buffer.alloc(4);
    length.writeUInt32LE(photo.length);
    return client.modelInfer({
      model_name: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1] }],
      raw_input_contents: [Buffer.concat([length, photo])],
    });
  };
  return { label, repo, server, infer, close: () => client.close(), rates: [], p50s: [] };
}

const photos = await fullHdPhotos();
const subjects = [await subject("A (as committed)", false), await subject(`B (${KEY}=${VALUE})`, true)];
try {
  await measureRounds(subjects, photos, {
    rounds: ROUNDS,
    concurrency: CONCURRENCY,
    seconds: SECONDS,
    latencyN: LATENCY_N,
  });
  printRounds(
    `${MODEL} ${KEY}=${VALUE}; concurrency ${CONCURRENCY}, ${ROUNDS} rounds of ${SECONDS} s; model ${process.env.BENCH_MODEL ?? "resnet50 (synthetic)"}`,
    subjects,
    {
      name: "A/B",
      values: subjects[0]!.rates.map((a, i) => a / subjects[1]!.rates[i]!),
    },
  );
} finally {
  for (const s of subjects) {
    s.close();
    await s.server.stop();
    await removeDir(s.repo);
  }
}
