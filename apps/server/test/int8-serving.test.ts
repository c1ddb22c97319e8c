/**
 * Issue 23, "Served": the int8 model that `models:quantize` writes as version 2 of
 * resnet50_inference runs in the seed ensemble with nothing else changed. Two temp copies of
 * the seed repository (models/resnet50_*\/config.pbtxt as committed), each with the synthetic
 * ResNet-50 as version 1; in one, the project's quantizer (`quantizeFile`, what the CLI runs,
 * with --reduce-range: this CPU has no VNNI) adds the QDQ int8 version 2, calibrated on two
 * fixture photos. Both served by the real server process, compared over HTTP and gRPC.
 */
import { copyFile, mkdtemp, readFile, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { frameBytes } from "@trellis/kserve/wire";
import { ModelInferRequestSchema } from "@trellis/protocol";
import {
  fixtureImagesDir,
  LABELS_PATH,
  makeSeedRepository,
  readFixtureImage,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { type QuantizeReport, quantizeFile, synthesizeResNet50 } from "@trellis/tooling";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { classifyOverHttp, grpcClientOf, jsonOf, metricValue, scrape, unframe } from "./helpers.js";

const INFERENCE = "resnet50_inference";
const ENSEMBLE = "resnet50_ensemble";
/** Calibration photos; the photos classified below are not among them. */
const CALIBRATION = ["chelsea.jpg", "horse.jpg"];
const PHOTOS = ["astronaut.jpg", "rocket.jpg", "camera.png"];

let work: string;
let fp32Repo: string;
let int8Repo: string;
let fp32: ServerProcess;
let int8: ServerProcess;
let report: QuantizeReport;

beforeAll(async () => {
  work = await mkdtemp(join(tmpdir(), "trellis-int8-work-"));
  [fp32Repo, int8Repo] = await Promise.all([
    makeSeedRepository({ prefix: "trellis-fp32-" }),
    makeSeedRepository({ prefix: "trellis-int8-" }),
  ]);
  const fp32Model = join(fp32Repo, INFERENCE, "1", "model.onnx");
  const v1 = join(int8Repo, INFERENCE, "1", "model.onnx");
  await synthesizeResNet50({ seed: 7, path: fp32Model });
  await copyFile(fp32Model, v1);
  const list = join(work, "calibration.txt");
  await writeFile(list, CALIBRATION.map((p) => join(fixtureImagesDir, p)).join("\n"));
  report = await quantizeFile({
    model: v1,
    calibration: list,
    out: join(int8Repo, INFERENCE, "2", "model.onnx"),
    reduceRange: true,
  });
  [fp32, int8] = await Promise.all([
    startServerProcess(["--model-repository", fp32Repo]),
    startServerProcess(["--model-repository", int8Repo]),
  ]);
});
afterAll(async () => {
  expect(await fp32?.stop()).toBe(0);
  expect(await int8?.stop()).toBe(0);
  await Promise.all([removeDir(fp32Repo), removeDir(int8Repo), removeDir(work)]);
});

/** The seed ensemble over HTTP (binary in and out): the OUTPUT_RESULTS string. */
const httpEnsemble = (server: ServerProcess, image: Uint8Array) => classifyOverHttp(server.http, image, ENSEMBLE);

async function grpcEnsemble(server: ServerProcess, image: Uint8Array): Promise<string> {
  const res = await grpcClientOf(server).modelInfer(
    create(ModelInferRequestSchema, {
      modelName: ENSEMBLE,
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [frameBytes([image])],
    }),
  );
  return unframe(res.rawOutputContents[0] as Uint8Array)[0] as string;
}

/** A photo through the served resnet50_preprocess: the [1,3,224,224] tensor's raw bytes. */
async function preprocessed(server: ServerProcess, image: Uint8Array): Promise<Uint8Array> {
  const res = await grpcClientOf(server).modelInfer(
    create(ModelInferRequestSchema, {
      modelName: "resnet50_preprocess",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [frameBytes([image])],
    }),
  );
  expect(res.outputs[0]?.shape).toEqual([1n, 3n, 224n, 224n]);
  return res.rawOutputContents[0] as Uint8Array;
}

/** resnet50_inference on a preprocessed tensor over gRPC (version "": the one the server serves): the version that answered, its logits. */
async function logits(
  server: ServerProcess,
  tensor: Uint8Array,
  modelVersion = "",
): Promise<{ version: string; values: Float32Array }> {
  const res = await grpcClientOf(server).modelInfer(
    create(ModelInferRequestSchema, {
      modelName: INFERENCE,
      modelVersion,
      inputs: [{ name: "input", datatype: "FP32", shape: [1n, 3n, 224n, 224n] }],
      rawInputContents: [tensor],
    }),
  );
  expect(res.outputs[0]?.shape).toEqual([1n, 1000n]);
  const values = new Float32Array(Uint8Array.from(res.rawOutputContents[0] as Uint8Array).buffer);
  return { version: res.modelVersion, values };
}

function correlation(a: Float32Array, b: Float32Array): number {
  const n = a.length;
  let ma = 0;
  let mb = 0;
  for (let i = 0; i < n; i++) {
    ma += a[i] as number;
    mb += b[i] as number;
  }
  ma /= n;
  mb /= n;
  let ab = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < n; i++) {
    const x = (a[i] as number) - ma;
    const y = (b[i] as number) - mb;
    ab += x * y;
    aa += x * x;
    bb += y * y;
  }
  return ab / Math.sqrt(aa * bb);
}

/** Inference counts per served version of resnet50_inference, from gRPC ModelStatistics. */
async function countsByVersion(server: ServerProcess): Promise<Record<string, bigint>> {
  const { modelStats } = await grpcClientOf(server).modelStatistics({ name: INFERENCE });
  return Object.fromEntries(modelStats.map((s) => [s.version, s.inferenceCount]));
}

const httpStatus = async (url: string) => (await fetch(url)).status;

describe("the int8 version in the seed repository", () => {
  it("is written by the quantizer as int8 kernels for ONNX Runtime: all 53 convolutions QLinearConv", () => {
    expect(report.calibrationImages).toHaveLength(CALIBRATION.length);
    expect(report.skippedImages).toEqual([]);
    expect(report.reduceRange).toBe(true);
    expect(report.ortOptimizedOps["com.microsoft:QLinearConv"]).toBe(53);
    expect(report.ortOptimizedOps.Conv ?? 0).toBe(0);
  });

  it("is what the server serves as resnet50_inference: version 2 ready, version 1 not, the config unchanged", async () => {
    const meta = await jsonOf(await fetch(`${int8.http}/v2/models/${INFERENCE}`));
    const fp32Meta = await jsonOf(await fetch(`${fp32.http}/v2/models/${INFERENCE}`));
    expect(meta.versions).toEqual(["2"]);
    expect(fp32Meta.versions).toEqual(["1"]);
    expect({ ...meta, versions: [] }).toEqual({ ...fp32Meta, versions: [] });

    expect(await httpStatus(`${int8.http}/v2/models/${INFERENCE}/versions/2/ready`)).toBe(200);
    expect(await httpStatus(`${int8.http}/v2/models/${INFERENCE}/versions/1/ready`)).not.toBe(200);
    expect(await httpStatus(`${int8.http}/v2/models/${ENSEMBLE}/ready`)).toBe(200);
    const grpc = grpcClientOf(int8);
    expect((await grpc.modelReady({ name: INFERENCE, version: "2" })).ready).toBe(true);
    expect((await grpc.modelReady({ name: INFERENCE, version: "1" })).ready).toBe(false);

    // Nothing else changed: every model's config reads as the fp32 repository's.
    for (const model of [INFERENCE, ENSEMBLE, "resnet50_preprocess", "resnet50_postprocess"]) {
      const a = await jsonOf(await fetch(`${int8.http}/v2/models/${model}/config`));
      const b = await jsonOf(await fetch(`${fp32.http}/v2/models/${model}/config`));
      expect(a, model).toEqual(b);
    }
    const index = await jsonOf(await fetch(`${int8.http}/v2/repository/index`, { method: "POST", body: "{}" }));
    expect(index.filter((m: { name: string }) => m.name === INFERENCE)).toEqual([
      expect.objectContaining({ name: INFERENCE, version: "2", state: "READY" }),
    ]);
  });

  it("classifies a photo through the unchanged seed ensemble over HTTP and gRPC, counted against version 2", async () => {
    const labels = new Set((await readFile(LABELS_PATH, "utf8")).split("\n").map((l) => l.trim()));
    const before = await countsByVersion(int8);
    const metricsBefore = await scrape(int8);
    expect(Object.keys(before)).toEqual(["2"]);
    for (const p of PHOTOS) {
      const image = readFixtureImage(p);
      const viaHttp = await httpEnsemble(int8, image);
      const viaGrpc = await grpcEnsemble(int8, image);
      expect(viaGrpc, p).toBe(viaHttp);
      const answer = JSON.parse(viaHttp) as Record<string, unknown[]>;
      const reference = JSON.parse(await httpEnsemble(fp32, image)) as Record<string, unknown[]>;
      // The fp32 answer's format: the same keys, five labels from the label file, five probabilities descending.
      expect(Object.keys(answer), p).toEqual(Object.keys(reference));
      const labelsOf = answer.top5_labels as string[];
      expect(labelsOf, p).toHaveLength(5);
      for (const l of labelsOf) expect(labels.has(l), `${p}: ${l}`).toBe(true);
      const probs = Object.values(answer).find((v) => typeof v[0] === "number") as number[];
      expect(probs, p).toHaveLength(5);
      for (let i = 0; i < 5; i++) {
        expect(probs[i], p).toBeGreaterThan(0);
        expect(probs[i], p).toBeLessThanOrEqual(1);
        if (i > 0) expect(probs[i], p).toBeLessThanOrEqual(probs[i - 1] as number);
      }
    }
    const after = await countsByVersion(int8);
    expect(Object.keys(after)).toEqual(["2"]);
    expect(Number((after["2"] as bigint) - (before["2"] as bigint))).toBe(2 * PHOTOS.length);
    const metricsAfter = await scrape(int8);
    const delta = (version: string) =>
      metricValue(metricsAfter, "nv_inference_count", INFERENCE, version) -
      metricValue(metricsBefore, "nv_inference_count", INFERENCE, version);
    expect(delta("2")).toBe(2 * PHOTOS.length);
    expect(delta("1")).toBe(0);
    const stats = await jsonOf(await fetch(`${int8.http}/v2/models/${INFERENCE}/versions/2/stats`));
    expect(stats.model_stats).toEqual([expect.objectContaining({ name: INFERENCE, version: "2" })]);
  });

  it("answers with logits that track the fp32 version 1's on the same preprocessed photos, but are its own", async () => {
    for (const p of PHOTOS) {
      const tensor = await preprocessed(int8, readFixtureImage(p));
      const same = Buffer.from(await preprocessed(fp32, readFixtureImage(p))).equals(Buffer.from(tensor));
      expect(same, `${p}: both servers preprocess alike`).toBe(true);
      const served = await logits(int8, tensor);
      expect(served.version, p).toBe("2");
      expect(await logits(int8, tensor, "2"), p).toEqual(served);
      const reference = await logits(fp32, tensor, "1");
      expect(reference.version, p).toBe("1");
      const q = served.values;
      const f = reference.values;
      const r = correlation(q, f);
      let maxDelta = 0;
      for (let i = 0; i < q.length; i++) maxDelta = Math.max(maxDelta, Math.abs((q[i] as number) - (f[i] as number)));
      expect(r, p).toBeGreaterThan(0.99);
      expect(maxDelta, `${p}: the int8 logits differ from fp32's`).toBeGreaterThan(0);
    }
    // Version 1 is on disk but not served: asked for by number, the int8 server refuses it.
    const refused = await logits(int8, await preprocessed(int8, readFixtureImage(PHOTOS[0] as string)), "1").then(
      () => undefined,
      (e: unknown) => ConnectError.from(e),
    );
    expect(refused?.code).toBe(Code.NotFound);
  });
});
