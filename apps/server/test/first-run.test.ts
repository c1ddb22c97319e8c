/**
 * A fresh clone's `pnpm start` where ResNet-50 cannot be downloaded: the real server process,
 * started with the flags the start script passes (--fetch-models, --default-model-repository, no
 * --model-repository), the project's models/ a fresh copy of the committed one
 * (TRELLIS_PROJECT_MODELS) and every download sent to a proxy that refuses connections. It
 * serves the seed ensemble with the bundled MobileNetV2 and real labels, says so, and classifies
 * real photos over HTTP and gRPC; a later start without fetching still says so. And the README's
 * first screen shows a newcomer the rest, each with its command.
 */
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { frameBytes } from "@trellis/kserve/wire";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  modelsDir,
  readFixtureImage,
  removeDir,
  repoRoot,
  type ServerProcess,
  seedModelNames,
  startServerProcess,
} from "@trellis/testing";
import { BUNDLED_NOTICE, INFERENCE_MODEL, isBundledModel, LABELS_FILE } from "@trellis/tooling/paths";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { classifyOverHttp, freePort, grpcClientOf, unframe } from "./helpers.js";

const PHOTOS = { "chelsea.jpg": "Egyptian cat", "coffee.jpg": "espresso" } as const;

let project: string;
let models: string;
let server: ServerProcess;
/** Whether the working tree's own models/ had weights before: the test must not change that. */
const ownModelBefore = existsSync(join(modelsDir, INFERENCE_MODEL));

beforeAll(async () => {
  project = await mkdtemp(join(tmpdir(), "trellis-fresh-"));
  models = join(project, "models");
  // models/ as a clone has it: each seed model's config.pbtxt and an empty version folder.
  for (const name of await seedModelNames()) {
    await mkdir(join(models, name, "1"), { recursive: true });
    await writeFile(join(models, name, "config.pbtxt"), await readFile(join(modelsDir, name, "config.pbtxt")));
  }
  const deadProxy = `http://127.0.0.1:${await freePort()}`;
  server = await startServerProcess(["--fetch-models", "--default-model-repository", models], {
    env: {
      TRELLIS_PROJECT_MODELS: models,
      HTTPS_PROXY: deadProxy,
      HTTP_PROXY: deadProxy,
      https_proxy: deadProxy,
      http_proxy: deadProxy,
      NO_PROXY: "",
      no_proxy: "",
    },
  });
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(project);
});

const top1 = (answer: string) => (JSON.parse(answer) as { top5_labels: string[] }).top5_labels[0];

const classifyHttp = (image: Uint8Array) => classifyOverHttp(server.http, image);

async function classifyGrpc(image: Uint8Array): Promise<string> {
  const res = await grpcClientOf(server).modelInfer(
    create(ModelInferRequestSchema, {
      modelName: "resnet50_ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [frameBytes([image])],
    }),
  );
  return unframe(res.rawOutputContents[0] as Uint8Array)[0] as string;
}

describe("pnpm start offline on a fresh clone", () => {
  it("installs the bundled MobileNetV2 and real labels into the project's models/, and says so once", async () => {
    expect(await isBundledModel(join(models, INFERENCE_MODEL))).toBe(true);
    const labels = (await readFile(join(models, LABELS_FILE), "utf8")).split("\n");
    expect([labels[285], labels[967]]).toEqual(["Egyptian cat", "espresso"]);
    const notices = server.logs.filter((l) => l.msg === BUNDLED_NOTICE);
    expect(notices).toHaveLength(1);
    expect(notices[0]).toMatchObject({ model: "resnet50_inference", repository: models });
    const why = server.logs.find((l) => String(l.msg).startsWith("ResNet-50 not downloaded"));
    expect(String(why?.msg)).toMatch(/cannot reach github\.com .*ECONNREFUSED/);
    expect(JSON.stringify(server.logs)).not.toMatch(/SYNTHETIC|synthetic_class/);
    // The page's address is in the line that says the server is ready.
    const started = server.logs.find((l) => l.msg === "server started");
    expect(started).toMatchObject({ ready: true, ui: `http://localhost:${server.httpPort}/ui/` });
    expect(existsSync(join(modelsDir, INFERENCE_MODEL))).toBe(ownModelBefore);
  });

  it("classifies chelsea.jpg as Egyptian cat and coffee.jpg as espresso over HTTP and gRPC", async () => {
    for (const [photo, label] of Object.entries(PHOTOS)) {
      const image = readFixtureImage(photo);
      const viaHttp = await classifyHttp(image);
      expect(top1(viaHttp), photo).toBe(label);
      expect(await classifyGrpc(image), photo).toBe(viaHttp);
    }
  });

  it("says so again on a later start that fetches nothing", async () => {
    const again = await startServerProcess(["--model-repository", models]);
    try {
      expect(again.logs.filter((l) => l.msg === BUNDLED_NOTICE)).toHaveLength(1);
      expect(again.logs.some((l) => String(l.msg).includes("fetching"))).toBe(false);
    } finally {
      expect(await again.stop()).toBe(0);
    }
  });
});

describe("the README's first screen", () => {
  it("names the page, the clients, the container, Kubernetes, int8 quantization and the GPU route, each with its command", async () => {
    const first = (await readFile(join(repoRoot, "README.md"), "utf8")).split("\n").slice(0, 60).join("\n");
    for (const needle of [
      "](docs/ui.png)",
      "pnpm install",
      "pnpm start",
      "http://localhost:8000/ui/",
      "pnpm client classify",
      "pnpm client perf",
      "docker run",
      "kubectl apply -k deploy/",
      "pnpm models:quantize",
      "pnpm trt:plan",
      "npm install @trellis/",
      BUNDLED_NOTICE,
    ]) {
      expect(first, needle).toContain(needle);
    }
    // The measured int8 speed-up, with the CPU it was measured on.
    expect(first).toMatch(/int8[\s\S]*\d\.\d+[–-]\d\.\d+×[\s\S]*(EPYC|Xeon|Ryzen|Core)/);
    // The screenshot is committed and small.
    const { size } = await stat(join(repoRoot, "docs", "ui.png"));
    expect(size).toBeLessThan(150 * 1024);
  });
});
