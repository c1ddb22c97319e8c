/**
 * The seed's ResNet-50 ensemble with real stages (preprocess, ONNX Runtime
 * with the shared MobileNetV2 in place of ResNet-50, postprocess): in one
 * process, then with preprocess and inference as separate gRPC services.
 */
import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import type { EnsembleStage } from "@trellis/ensemble-runner";
import { Code, type Stage, type Tensor, tensor } from "@trellis/stage";
import {
  fixturePhotos,
  makeSeedRepository,
  readFixtureImage,
  referenceTop5OnThisCpu,
  removeDir,
  STABLE_TOP1,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { loadStage, type RepositoryModel, scanRepository } from "../src/index.js";

// Real models on a shared 2-core machine: generous per-test limits (the assertions are not about time).
vi.setConfig({ testTimeout: 60_000 });

const pkg = join(import.meta.dirname, "..");
/** ONNX Runtime on the seed's reference tensors, on this CPU: the int8 model's kernels differ between CPUs. */
const reference = await referenceTop5OnThisCpu();

let repo: string;
let models: RepositoryModel[];
let local: EnsembleStage;
let photos: { name: string; bytes: Uint8Array }[];
const children = new Set<ChildProcess>();

const model = (name: string) => models.find((m) => m.name === name)!;
const batch = (items: Uint8Array[]): Tensor => tensor("RAW_IMAGE", "BYTES", [items.length, 1], items);
const json = (t: Tensor | undefined) =>
  (t!.data as Uint8Array[]).map((b) => JSON.parse(Buffer.from(b).toString("utf8")));
/** The seed's JSON is {"<labels key>": [label, ...], "<probs key>": [p, ...]}, best first: its top-1 label. */
const top1 = (result: unknown): string => {
  const labels = Object.values(result as Record<string, unknown[]>).find((v) => typeof v[0] === "string");
  return labels?.[0] as string;
};

/** The child processes import dist/: rebuild it when any source file is newer. */
async function ensureBuilt() {
  const built = await stat(join(pkg, "dist", "index.js")).catch(() => undefined);
  const sources = await readdir(join(pkg, "src"), { recursive: true });
  const newest = Math.max(...(await Promise.all(sources.map(async (f) => (await stat(join(pkg, "src", f))).mtimeMs))));
  if (!built || built.mtimeMs < newest) execFileSync("npx", ["tsc", "-p", "tsconfig.build.json"], { cwd: pkg });
}

/** Starts `serve-model.mjs` for one model; resolves with its port once it listens. */
function serve(name: string, port = 0): Promise<{ child: ChildProcess; port: number; url: string }> {
  const child = spawn(
    process.execPath,
    [join(import.meta.dirname, "fixtures", "serve-model.mjs"), repo, name, String(port)],
    {
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  children.add(child);
  child.on("exit", () => children.delete(child));
  return new Promise((resolve, reject) => {
    let out = "";
    let err = "";
    child.stderr!.on("data", (d) => {
      err += d;
    });
    child.stdout!.on("data", (d) => {
      out += d;
      const m = /PORT (\d+)/.exec(out);
      if (m) resolve({ child, port: Number(m[1]), url: `http://127.0.0.1:${m[1]}` });
    });
    child.on("exit", (code) => reject(new Error(`${name} server exited with ${code}: ${err}`)));
  });
}

const killed = (child: ChildProcess) =>
  new Promise<void>((resolve) => {
    child.once("exit", () => resolve());
    child.kill("SIGKILL");
  });

beforeAll(async () => {
  const build = ensureBuilt();
  repo = await makeSeedRepository();
  ({ models } = await scanRepository([repo]));
  local = (await loadStage(model("resnet50_ensemble"), { version: "1" })) as EnsembleStage;
  photos = fixturePhotos().map((name) => ({ name, bytes: readFixtureImage(name) }));
  await build;
}, 60_000);

afterAll(async () => {
  await local?.close();
  await Promise.all([...children].map(killed));
  await removeDir(repo);
});

describe("seed ensemble, in-process", () => {
  it("classifies every photo as the reference does (top-1)", async () => {
    const res = await local.infer({ inputs: [batch(photos.map((p) => p.bytes))] });
    expect(res.outputs.map((o) => [o.name, o.datatype, o.shape])).toEqual([
      ["OUTPUT_RESULTS", "BYTES", [photos.length, 1]],
    ]);
    const got = json(res.outputs[0]).map(top1);
    expect(got).toEqual(photos.map((p) => reference[p.name]!.top5_labels[0]));
    // The README's top-1s that hold on any CPU: the real classes, not just agreement with ONNX Runtime.
    for (const [name, { label }] of Object.entries(STABLE_TOP1)) {
      expect(got[photos.findIndex((p) => p.name === name)], name).toBe(label);
    }
    const steps = local.stepStatistics();
    expect(steps.map((s) => [s.model, s.statistics.inferenceStats?.success?.count])).toEqual([
      ["resnet50_preprocess", 1n],
      ["resnet50_inference", 1n],
      ["resnet50_postprocess", 1n],
    ]);
  });

  it("names the failing step and keeps its code for a truncated JPEG", async () => {
    const truncated = readFixtureImage(TRUNCATED_PHOTO);
    const err = await local.infer({ inputs: [batch([photos[0]!.bytes, truncated])] }).catch((e) => e);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toMatch(/^resnet50_ensemble: step 0 resnet50_preprocess: INVALID_ARGUMENT: /);
  });
});

describe("seed ensemble, preprocess and inference as separate processes", () => {
  let remote: Stage;
  let inference: { child: ChildProcess; port: number; url: string };

  beforeAll(async () => {
    const [pre, inf] = await Promise.all([serve("resnet50_preprocess"), serve("resnet50_inference")]);
    inference = inf;
    remote = await loadStage(model("resnet50_ensemble"), {
      version: "1",
      endpoints: { resnet50_preprocess: pre.url, resnet50_inference: inf.url },
    });
  }, 60_000);
  afterAll(() => remote?.close());

  it("gives byte-identical results to the in-process run", async () => {
    const inputs = [batch(photos.map((p) => p.bytes))];
    const [a, b] = await Promise.all([local.infer({ inputs }), remote.infer({ inputs })]);
    const bytes = (t: Tensor | undefined) => (t!.data as Uint8Array[]).map((x) => Buffer.from(x).toString("base64"));
    expect(bytes(b.outputs[0])).toEqual(bytes(a.outputs[0]));
    expect(b.outputs[0]!.shape).toEqual(a.outputs[0]!.shape);
  });

  it("fails in-flight requests fast with UNAVAILABLE when a remote step dies, and recovers when it returns", async () => {
    const ensemble = remote as EnsembleStage;
    // A hang would end at this deadline as DEADLINE_EXCEEDED; UNAVAILABLE below proves it failed before.
    const deadline = 20_000;
    const pending = photos.map((p) =>
      ensemble.infer({ inputs: [batch([p.bytes])] }, { signal: AbortSignal.timeout(deadline) }).then(
        () => undefined,
        (e) => e,
      ),
    );
    // Kill the inference service while requests are inside it.
    await expect
      .poll(() => ensemble.stepStatistics()[1]!.inflight, { interval: 2, timeout: 10_000 })
      .toBeGreaterThan(0);
    await killed(inference.child);
    const outcomes = await Promise.all(pending);
    const failures = outcomes.filter((e) => e !== undefined);
    expect(failures.length).toBeGreaterThan(0);
    for (const err of failures) {
      expect(err.code, err.rawMessage).toBe(Code.Unavailable);
      expect(err.rawMessage).toContain("step 1 resnet50_inference: UNAVAILABLE");
    }
    expect(ensemble.stepStatistics().every((s) => s.inflight === 0 && s.waiting === 0)).toBe(true);

    // Same port, same ensemble object: requests succeed again.
    inference = await serve("resnet50_inference", inference.port);
    const res = await ensemble.infer({ inputs: [batch([photos[0]!.bytes])] });
    expect(top1(json(res.outputs[0])[0])).toBe(reference[photos[0]!.name]!.top5_labels[0]);
  });
});
