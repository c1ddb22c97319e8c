import { copyFile, mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { listenStage } from "@trellis/frontends";
import { connectStage, grpcTransport } from "@trellis/kserve";
import { parseModelConfig } from "@trellis/protocol";
import { bytesToStrings, Code, defineStage, type InferRequest, type StageError, tensor } from "@trellis/stage";
import { type CpuTop5, LABELS_PATH, modelsDir, referenceTop5OnThisCpu, STABLE_TOP1 } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPostprocess, createStage, type PostprocessStage } from "../src/index.js";

/** A version folder holding imagenet_classes.txt: the bundled labels under the name the seed's config gives. */
const labelsDir = await mkdtemp(join(tmpdir(), "trellis-labels-"));
await copyFile(LABELS_PATH, join(labelsDir, "imagenet_classes.txt"));
afterAll(() => rm(labelsDir, { recursive: true, force: true }));
const configPath = join(modelsDir, "resnet50_postprocess", "config.pbtxt");

const seedConfig = async () => parseModelConfig(await readFile(configPath, "utf8"));

async function expectStageError(p: Promise<unknown> | (() => unknown), code: Code, ...parts: string[]) {
  let caught: unknown;
  try {
    await (typeof p === "function" ? p() : p);
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(Error);
  const err = caught as StageError;
  expect(err.code).toBe(code);
  for (const part of parts) expect(err.message).toContain(part);
  return err;
}

const logitsRequest = (data: Float32Array, n: number, c: number, extra: Partial<InferRequest> = {}): InferRequest => ({
  inputs: [tensor("LOGITS", "FP32", [n, c], data)],
  ...extra,
});

describe("postprocess on real MobileNetV2 logits", () => {
  let stage: PostprocessStage;
  let names: string[];
  let logits: Float32Array;
  /** MobileNetV2 by onnxruntime-node on this CPU (int8 kernels differ between CPUs): logits and the seed's top-5 of them. */
  let reference: Record<string, CpuTop5>;
  let labels: string[];

  beforeAll(async () => {
    reference = await referenceTop5OnThisCpu();
    names = Object.keys(reference).sort();
    logits = new Float32Array(names.length * 1000);
    for (const [i, name] of names.entries()) logits.set(reference[name]!.logits, i * 1000);
    labels = (await readFile(LABELS_PATH, "utf8")).split("\n");
    stage = await createPostprocess({ config: await seedConfig(), versionDir: labelsDir });
  });

  it("gives the reference top-5 for every photo", async () => {
    expect(names.length).toBeGreaterThanOrEqual(11);
    const res = await stage.infer(logitsRequest(logits, names.length, 1000));
    const out = res.outputs[0]!;
    expect(out.name).toBe("OUTPUT_RESULTS");
    expect(out.datatype).toBe("BYTES");
    expect(out.shape).toEqual([names.length, 1]);
    const strings = bytesToStrings(out);
    for (const [i, name] of names.entries()) {
      const s = strings[i]!;
      // json.dumps layout: ", " and ": " separators, keys in insertion order.
      expect(s).toMatch(/^\{"top5_labels": \[("[^"]*"(, )?){5}\], "top5_probs": \[([0-9.e-]+(, )?){5}\]\}$/);
      const got = JSON.parse(s) as { top5_labels: string[]; top5_probs: number[] };
      const want = reference[name]!;
      expect(got.top5_labels, name).toEqual(want.top5_labels);
      expect(
        got.top5_labels.map((l) => labels.indexOf(l)),
        name,
      ).toEqual(want.top5_index);
      for (let j = 0; j < 5; j++) expect(Math.abs(got.top5_probs[j]! - want.top5_probs[j]!), name).toBeLessThan(1e-3);
    }
    // The real classes, on any CPU: the README's photos whose top-1 no CPU changes.
    for (const [name, { label }] of Object.entries(STABLE_TOP1)) {
      const got = JSON.parse(strings[names.indexOf(name)]!) as { top5_labels: string[] };
      expect(got.top5_labels[0], name).toBe(label);
    }
  });

  it("serves the same bytes over gRPC", async () => {
    const server = await listenStage(stage);
    try {
      const remote = await connectStage(grpcTransport(server.url), stage.name, { remoteLabel: server.url });
      expect(await remote.isReady()).toBe(true);
      const meta = await remote.metadata();
      expect(meta.inputs).toEqual([{ name: "LOGITS", datatype: "FP32", shape: [-1, 1000] }]);
      expect(meta.outputs).toEqual([{ name: "OUTPUT_RESULTS", datatype: "BYTES", shape: [-1, 1] }]);
      const request = logitsRequest(logits, names.length, 1000);
      const [local, overWire] = await Promise.all([stage.infer(request), remote.infer(request)]);
      expect(overWire.outputs[0]!.shape).toEqual(local.outputs[0]!.shape);
      // Byte-for-byte: compare contents, not the array classes the transports use.
      const hex = (r: typeof local) => (r.outputs[0]!.data as Uint8Array[]).map((b) => Buffer.from(b).toString("hex"));
      expect(hex(overWire)).toEqual(hex(local));

      const cls = await remote.infer({
        ...request,
        outputs: [{ name: "OUTPUT_RESULTS", parameters: { classification: 3 } }],
      });
      expect(cls.outputs[0]!.shape).toEqual([names.length, 3]);
      const rows = bytesToStrings(cls.outputs[0]!);
      const chelsea = names.indexOf("chelsea.jpg");
      const want = reference["chelsea.jpg"]!;
      for (let j = 0; j < 3; j++) {
        const [score, index, label] = rows[chelsea * 3 + j]!.split(":");
        expect(score).toMatch(/^\d\.\d{6}$/);
        expect(Math.abs(Number(score) - want.top5_probs[j]!)).toBeLessThan(1e-3);
        expect(Number(index)).toBe(want.top5_index[j]);
        expect(label).toBe(want.top5_labels[j]);
      }

      await expectStageError(
        remote.infer(logitsRequest(new Float32Array(999), 1, 999)),
        Code.InvalidArgument,
        "unexpected shape for input 'LOGITS' for model",
        "Expected [-1,1000], got [1,999]",
      );
      const stats = await remote.statistics();
      expect(stats.inferenceStats?.success?.count).toBeGreaterThanOrEqual(2n);
      expect(stats.inferenceStats?.fail?.count).toBeGreaterThanOrEqual(1n);
    } finally {
      await server.close();
    }
  });

  it("classification returns k score:index:label strings per item", async () => {
    const row = logits.subarray(0, 1000);
    const res = await stage.infer({
      inputs: [tensor("LOGITS", "FP32", [1, 1000], row)],
      outputs: [{ name: "OUTPUT_RESULTS", parameters: { classification: 7n } }],
    });
    const rows = bytesToStrings(res.outputs[0]!);
    expect(res.outputs[0]!.shape).toEqual([1, 7]);
    const json = JSON.parse(bytesToStrings((await stage.infer(logitsRequest(row, 1, 1000))).outputs[0]!)[0]!);
    for (let j = 0; j < 5; j++) {
      const [score, index, label] = rows[j]!.split(":");
      expect(label).toBe(json.top5_labels[j]);
      expect(labels[Number(index)]).toBe(label);
      expect(Number(score)).toBeCloseTo(json.top5_probs[j], 6);
    }
    await expectStageError(
      stage.infer(
        logitsRequest(row, 1, 1000, { outputs: [{ name: "OUTPUT_RESULTS", parameters: { classification: 0 } }] }),
      ),
      Code.InvalidArgument,
      "classification must be an integer from 1 to 1000, got 0",
    );
  });
});

describe("postprocess errors and options", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "postprocess-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("fails to load when the label count differs from the classes", async () => {
    const text = await readFile(LABELS_PATH, "utf8");
    await writeFile(join(dir, "imagenet_classes.txt"), text.split("\n").slice(0, 999).join("\n"));
    await expectStageError(
      createPostprocess({ config: await seedConfig(), versionDir: dir }),
      Code.InvalidArgument,
      "label count 999",
      "1000 classes",
    );
  });

  it("fails to load without a label file, naming the file but not the folder", async () => {
    const err = await expectStageError(
      createPostprocess({ config: await seedConfig(), versionDir: join(dir, "nowhere") }),
      Code.NotFound,
      "cannot read label file imagenet_classes.txt (ENOENT)",
    );
    expect(err.message).not.toContain(dir);
  });

  it("refuses a label_filename outside the model's folder", async () => {
    const config = await seedConfig();
    config.output[0]!.labelFilename = "../../../../etc/passwd";
    await expectStageError(
      createPostprocess({ config, modelDir: dir, versionDir: labelsDir }),
      Code.InvalidArgument,
      'label_filename "../../../../etc/passwd" must name a file inside the model\'s folder',
    );
  });

  it("rejects NaN and Inf logits naming the batch item", async () => {
    const stage = await createPostprocess({ config: await seedConfig(), versionDir: labelsDir });
    const data = new Float32Array(3 * 1000);
    data[1000 + 17] = Number.NaN;
    await expectStageError(
      stage.infer(logitsRequest(data, 3, 1000)),
      Code.InvalidArgument,
      "batch item 1",
      "NaN",
      "class 17",
    );
    data[1000 + 17] = 0;
    data[2000 + 999] = Number.POSITIVE_INFINITY;
    await expectStageError(stage.infer(logitsRequest(data, 3, 1000)), Code.InvalidArgument, "batch item 2", "Infinity");
    expect(stage.statistics().inferenceStats?.fail?.count).toBe(2n);
  });

  it("rejects wrong inputs in Triton's words (core src/infer_request.cc, src/model.cc)", async () => {
    const stage = await createPostprocess({ config: await seedConfig(), versionDir: labelsDir });
    await expectStageError(
      stage.infer({ inputs: [tensor("LOGITS", "FP64", [1, 1000], new Float64Array(1000))] }),
      Code.InvalidArgument,
      "inference input 'LOGITS' data-type is 'FP64', but model 'resnet50_postprocess' expects 'FP32'",
    );
    await expectStageError(
      stage.infer({ inputs: [tensor("PROBS", "FP32", [1, 1000], new Float32Array(1000))] }),
      Code.InvalidArgument,
      "unexpected inference input 'PROBS' for model 'resnet50_postprocess'",
    );
    await expectStageError(
      stage.infer(logitsRequest(new Float32Array(257000), 257, 1000)),
      Code.InvalidArgument,
      "inference request batch-size must be <= 256 for 'resnet50_postprocess'",
    );
    await expectStageError(
      stage.infer(logitsRequest(new Float32Array(1000), 1, 1000, { outputs: [{ name: "OUT" }] })),
      Code.InvalidArgument,
      "unexpected inference output 'OUT' for model 'resnet50_postprocess'",
    );
  });

  it("follows top_k and label_filename from the config", async () => {
    await writeFile(join(dir, "animals.txt"), "cat\ndog\r\n  bird  \nfish\n");
    const config = parseModelConfig(`
      name: "tiny_post"
      backend: "typescript"
      max_batch_size: 4
      input [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 4 ] } ]
      output [ { name: "TOP" data_type: TYPE_STRING dims: [ 1 ] label_filename: "animals.txt" } ]
      parameters { key: "top_k" value: { string_value: "3" } }
    `);
    const stage = defineStage(await createStage({ config, modelDir: dir, version: "2", versionDir: join(dir, "2") }));
    const res = await stage.infer({
      inputs: [tensor("SCORES", "FP32", [2, 4], new Float32Array([0, 2, 1, -1, 5, 5, 5, 5]))],
    });
    expect(res.modelVersion).toBe("2");
    const [a, b] = bytesToStrings(res.outputs[0]!);
    const e = [1, Math.E ** 2, Math.E, Math.E ** -1];
    const sum = e.reduce((x, y) => x + y);
    const got = JSON.parse(a!);
    expect(Object.keys(got)).toEqual(["top3_labels", "top3_probs"]);
    expect(got.top3_labels).toEqual(["dog", "bird", "cat"]);
    const want = [e[1]!, e[2]!, e[0]!];
    for (const [j, p] of (got.top3_probs as number[]).entries()) expect(p).toBeCloseTo(want[j]! / sum, 6);
    // All four tie: NumPy's argsort keeps them in index order, and [-3:][::-1] takes the last three reversed.
    expect(b).toBe('{"top3_labels": ["fish", "bird", "dog"], "top3_probs": [0.25, 0.25, 0.25]}');

    await expectStageError(
      createPostprocess({ config, modelDir: dir, topK: 5 }),
      Code.InvalidArgument,
      "top_k must be an integer from 1 to 4, got 5",
    );
  });
});
