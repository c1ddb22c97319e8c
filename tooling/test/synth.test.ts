import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { toBinary } from "@bufbuild/protobuf";
import * as ort from "onnxruntime-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ModelProtoSchema } from "../src/gen/onnx_pb.js";
import {
  buildResNet50,
  countParameters,
  isSyntheticModel,
  RESNET50_PARAMETERS,
  readOnnxMetadata,
  SYNTHETIC_METADATA_KEY,
  synthesizeResNet50,
  writeSyntheticLabels,
} from "../src/index.js";

const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

describe("synthetic ResNet-50", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "synth-"));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("has torchvision's topology and parameter count", () => {
    const model = buildResNet50({ seed: 3 });
    expect(countParameters(model)).toBe(RESNET50_PARAMETERS);
    expect(RESNET50_PARAMETERS).toBe(25_557_032);
    const ops = (t: string) => model.graph!.node.filter((n) => n.opType === t).length;
    // 1 stem + 16 blocks x 3 + 4 downsample convs
    expect(ops("Conv")).toBe(53);
    expect(ops("BatchNormalization")).toBe(53);
    expect(ops("Add")).toBe(16);
    expect(ops("Gemm")).toBe(1);
    expect(model.opsetImport[0]!.version).toBe(13n);
    // v1.5: in each stage's first block the stride is on the 3x3 conv, not the first 1x1.
    const strides = (name: string) =>
      model.graph!.node.find((n) => n.name === name)!.attribute.find((a) => a.name === "strides")!.ints;
    expect(strides("layer2.0.conv1")).toEqual([1n, 1n]);
    expect(strides("layer2.0.conv2")).toEqual([2n, 2n]);
    expect(strides("layer2.0.downsample.0")).toEqual([2n, 2n]);
  });

  it("writes a model onnxruntime runs at batch 1 and 2, labelled synthetic", async () => {
    const path = join(dir, "1", "model.onnx");
    const r = await synthesizeResNet50({ seed: 11, path });
    expect(r.parameters).toBe(RESNET50_PARAMETERS);
    const bytes = await readFile(path);
    expect(bytes.byteLength).toBe(r.bytes);
    expect(sha(bytes)).toBe(r.sha256);

    const meta = await readOnnxMetadata(path);
    expect(meta.metadata[SYNTHETIC_METADATA_KEY]).toBe("true");
    expect(meta.metadata["trellis.seed"]).toBe("11");
    expect(meta.docString).toContain("SYNTHETIC");
    expect(await isSyntheticModel(path)).toBe(true);

    const session = await ort.InferenceSession.create(path);
    try {
      expect(session.inputNames).toEqual(["input"]);
      expect(session.outputNames).toEqual(["output"]);
      const input = new Float32Array(2 * 3 * 224 * 224);
      for (let i = 0; i < input.length; i++) input[i] = Math.sin(i * 0.001) * 2;
      const two = await session.run({ input: new ort.Tensor("float32", input, [2, 3, 224, 224]) });
      expect(two.output!.dims).toEqual([2, 1000]);
      const logits = two.output!.data as Float32Array;
      expect(logits.every(Number.isFinite)).toBe(true);
      expect(new Set(logits).size).toBeGreaterThan(1000);
      const one = await session.run({
        input: new ort.Tensor("float32", input.subarray(3 * 224 * 224), [1, 3, 224, 224]),
      });
      expect(one.output!.dims).toEqual([1, 1000]);
      const row = one.output!.data as Float32Array;
      for (let i = 0; i < 1000; i++) expect(row[i]).toBeCloseTo(logits[1000 + i]!, 3);
    } finally {
      await session.release();
    }
  });

  it("is deterministic per seed", async () => {
    const a = sha(toBinary(ModelProtoSchema, buildResNet50({ seed: 11 })));
    expect(a).toBe(sha(await readFile(join(dir, "1", "model.onnx"))));
    const b = sha(toBinary(ModelProtoSchema, buildResNet50({ seed: 12 })));
    expect(b).not.toBe(a);
  });

  it("writes placeholder labels only where none exist", async () => {
    const path = join(dir, "labels", "imagenet_classes.txt");
    expect(await writeSyntheticLabels(path)).toBe(true);
    const lines = (await readFile(path, "utf8")).split("\n");
    expect(lines).toHaveLength(1000);
    expect(lines[999]).toBe("synthetic_class_999");
    expect(await writeSyntheticLabels(path, 5)).toBe(false);
    expect((await readFile(path, "utf8")).split("\n")).toHaveLength(1000);
  });
});
