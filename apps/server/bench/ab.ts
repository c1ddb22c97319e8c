/**
 * A/B: this checkout's server against another build of it (AB_BASELINE: the path of the other
 * checkout's apps/server/dist/main.js, e.g. a `git worktree` of the commit before a change), both
 * serving one seed repository, measured in the same run in interleaved rounds (the order
 * alternating each round), so a slow spell on a shared machine falls on both. Per round and
 * subject: AB_CONCURRENCY (8) gRPC callers of 1920x1080 JPEGs for AB_SECONDS (10) after a 2 s
 * warm-up; reported: requests/s and p50 per round, their median and spread (min-max), and the
 * ratio B/A per round. Before timing, both servers answer every photo and their answers must be
 * byte-identical. The model is the shared MobileNetV2 int8, or the synthetic ResNet-50
 * (ResNet-50's cost) with BENCH_MODEL=resnet50.
 * Run: AB_BASELINE=/tmp/base/apps/server/dist/main.js node apps/server/dist/bench/ab.js (or pnpm bench:ab).
 * AB_DEFAULT_INSTANCES=1 (no AB_BASELINE): this checkout's server twice, A serving the seed repository
 * as shipped (inference `count: 1`), B the same repository with inference's instance_group removed,
 * so it runs Triton's default for onnxruntime (2 CPU instances, each half the cores): issue 57.
 */
import { cp, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { createClient } from "@connectrpc/connect";
import { grpcTransport } from "@trellis/kserve";
import { frameBytes } from "@trellis/kserve/wire";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import { makeSeedRepository, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { synthesizeResNet50 } from "@trellis/tooling";
import { fullHdPhotos, PHOTOS } from "./photos.js";
import { measureRounds, printRounds, type RoundSubject } from "./rounds.js";

const BASELINE = process.env.AB_BASELINE;
/** B: this checkout's server, unless AB_CANDIDATE names another build (AB_CANDIDATE=$AB_BASELINE: an A/A run, the bias of the method). */
const CANDIDATE = process.env.AB_CANDIDATE;
const SECONDS = Number(process.env.AB_SECONDS ?? 10);
const ROUNDS = Number(process.env.AB_ROUNDS ?? 4);
const CONCURRENCY = Number(process.env.AB_CONCURRENCY ?? 8);
const DEFAULT_INSTANCES = process.env.AB_DEFAULT_INSTANCES === "1";
if (!BASELINE && !DEFAULT_INSTANCES) {
  console.error("set AB_BASELINE to the other build's apps/server/dist/main.js (or AB_DEFAULT_INSTANCES=1)");
  process.exit(2);
}

const photos = await fullHdPhotos();
const repo = await makeSeedRepository({ prefix: "trellis-ab-" });
if (process.env.BENCH_MODEL === "resnet50") {
  await synthesizeResNet50({ seed: 7, path: join(repo, "resnet50_inference", "1", "model.onnx") });
}
/** B's repository in AB_DEFAULT_INSTANCES mode: the same, inference without instance_group. */
const defaultsRepo = DEFAULT_INSTANCES ? await withoutInferenceInstances(repo) : undefined;

async function withoutInferenceInstances(from: string): Promise<string> {
  const to = `${from}-defaults`;
  await cp(from, to, { recursive: true });
  const config = join(to, "resnet50_inference", "config.pbtxt");
  const text = await readFile(config, "utf8");
  const stripped = text.replace(/instance_group\s*\[[^\]]*\]/, "");
  if (stripped === text) throw new Error("resnet50_inference's config has no instance_group to remove");
  await writeFile(config, stripped);
  return to;
}

interface Subject extends RoundSubject {
  server: ServerProcess;
  infer: (photo: Uint8Array) => Promise<string>;
  close: () => void;
}

async function subject(label: string, main: string | undefined, repository = repo): Promise<Subject> {
  const server = await startServerProcess(["--model-repository", repository], main ? { main } : {});
  const transport = grpcTransport(server.grpc);
  const client = createClient(GRPCInferenceService, transport);
  const infer = async (photo: Uint8Array) => {
    const res = await client.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: "resnet50_ensemble",
        inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
        rawInputContents: [frameBytes([photo])],
      }),
    );
    return Buffer.from(res.rawOutputContents[0] ?? []).toString("latin1");
  };
  return { label, server, infer, close: () => transport.close(), rates: [], p50s: [] };
}

const subjects = defaultsRepo
  ? [
      await subject("A (inference count: 1, as shipped)", undefined),
      await subject("B (no instance_group: Triton's default)", undefined, defaultsRepo),
    ]
  : [
      await subject("A (baseline)", BASELINE),
      await subject(CANDIDATE ? "B (AB_CANDIDATE)" : "B (this checkout)", CANDIDATE),
    ];
try {
  // Same answers, byte for byte, before anything is timed.
  for (const [i, photo] of photos.entries()) {
    const [a, b] = await Promise.all(subjects.map((s) => s.infer(photo)));
    if (a !== b) throw new Error(`${PHOTOS[i]}: the two servers answer differently:\n${a}\n${b}`);
  }
  console.log(`answers identical for ${photos.length} photos`);
  await measureRounds(subjects, photos, { rounds: ROUNDS, concurrency: CONCURRENCY, seconds: SECONDS });
  printRounds(
    `concurrency ${CONCURRENCY}, ${ROUNDS} rounds of ${SECONDS} s, model ${process.env.BENCH_MODEL ?? "mobilenet"}`,
    subjects,
    {
      name: "B/A",
      values: subjects[1]!.rates.map((b, i) => b / subjects[0]!.rates[i]!),
    },
  );
} finally {
  for (const s of subjects) {
    s.close();
    await s.server.stop();
  }
  await removeDir(repo);
  if (defaultsRepo) await removeDir(defaultsRepo);
}
