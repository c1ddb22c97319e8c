import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import { fixtureImagesDir, MOBILENET_PATH, readReferenceTensor } from "@trellis/testing";
import * as ort from "onnxruntime-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { writeOptimizedGraph } from "../src/calibrate.js";
import { GraphProtoSchema, type ModelProto, ModelProtoSchema, OperatorSetIdProtoSchema } from "../src/gen/onnx_pb.js";
import { floatTensor, floatValueInfo, node } from "../src/onnx.js";
import {
  activationParams,
  countOps,
  depthwiseInputs,
  dequantizeModel,
  equalizeDepthwiseInputs,
  foldBatchNorms,
  planQuantization,
  quantizeModel,
  roundHalfEven,
  tensorValues,
} from "../src/quantize.js";
import { quantizeFile } from "../src/quantize-file.js";

// The repository's own photos, bundled MobileNetV2 and reference tensors (@trellis/testing).
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");
const f32 = Math.fround;

/**
 * input [N,3,8,8] → Conv 3→4 (1×1, bias) → Relu → Conv 4→2 (3×3, pad 1) → Add(conv2, conv2b)
 * → GlobalAveragePool → Flatten → Gemm 2→3 → output. Weights chosen so each output channel's
 * largest |w| is known.
 */
function tinyModel(size = 8): ModelProto {
  const w1 = new Float32Array(4 * 3);
  // channel c: weights c+1, -(c+1)/2, 0.25 → absmax c+1
  for (let c = 0; c < 4; c++) w1.set([c + 1, -(c + 1) / 2, 0.25], c * 3);
  const w2 = new Float32Array(2 * 4 * 9).map((_, i) => ((i % 7) - 3) / 10); // values in [-0.3, 0.3]
  w2[0] = -0.5; // channel 0 absmax 0.5
  const w3 = new Float32Array(2 * 4 * 9).map((_, i) => ((i % 5) - 2) / 8);
  const gemm = new Float32Array([1, -2, 0.5, 0.25, 1, -1]); // [K=2, N=3]
  const graph = create(GraphProtoSchema, {
    name: "tiny",
    node: [
      node("Conv", "conv1", ["input", "w1", "b1"], ["c1"], { kernel_shape: [1, 1] }),
      node("Relu", "relu1", ["c1"], ["r1"]),
      node("Conv", "conv2", ["r1", "w2"], ["c2"], { kernel_shape: [3, 3], pads: [1, 1, 1, 1] }),
      node("Conv", "conv3", ["r1", "w3"], ["c3"], { kernel_shape: [3, 3], pads: [1, 1, 1, 1] }),
      node("Add", "add", ["c2", "c3"], ["s"]),
      node("GlobalAveragePool", "gap", ["s"], ["g"]),
      node("Flatten", "flatten", ["g"], ["f"], { axis: 1 }),
      node("Gemm", "fc", ["f", "wfc", "bfc"], ["output"]),
    ],
    initializer: [
      floatTensor("w1", [4, 3, 1, 1], w1),
      floatTensor("b1", [4], Float32Array.of(0.1, -0.2, 0.3, 0)),
      floatTensor("w2", [2, 4, 3, 3], w2),
      floatTensor("w3", [2, 4, 3, 3], w3),
      floatTensor("wfc", [2, 3], gemm),
      floatTensor("bfc", [3], Float32Array.of(0, 1, -1)),
    ],
    input: [floatValueInfo("input", ["N", 3, size, size])],
    output: [floatValueInfo("output", ["N", 3])],
  });
  return create(ModelProtoSchema, {
    irVersion: 7n,
    producerName: "quantize.test",
    opsetImport: [create(OperatorSetIdProtoSchema, { domain: "", version: 13n })],
    graph,
  });
}

const RANGES = {
  input: { min: -2, max: 2 },
  r1: { min: 0, max: 6 },
  c2: { min: -1, max: 3 },
  c3: { min: -3, max: 1 },
  s: { min: -4, max: 4 },
  g: { min: -1, max: 1 },
  f: { min: -1, max: 1 },
};

const init = (m: ModelProto, name: string) => {
  const t = m.graph!.initializer.find((x) => x.name === name);
  if (!t) throw new Error(`no initializer ${name}`);
  return t;
};

describe("activation quantization parameters", () => {
  it("uint8: scale = (max − min) / 255, zero point = round(−min / scale), range widened to hold 0", () => {
    expect(activationParams({ min: -1, max: 3 })).toEqual({ scale: f32(4 / 255), zeroPoint: 64 });
    expect(activationParams({ min: 0, max: 6 })).toEqual({ scale: f32(6 / 255), zeroPoint: 0 });
    expect(activationParams({ min: 0.5, max: 2.55 })).toEqual({ scale: f32(2.55 / 255), zeroPoint: 0 });
    expect(activationParams({ min: -2, max: -1 })).toEqual({ scale: f32(2 / 255), zeroPoint: 255 });
  });
  it("int8: zero point = round(−128 − min / scale); rounding is half to even, as numpy", () => {
    expect(activationParams({ min: -1, max: 3 }, "int8")).toEqual({ scale: f32(4 / 255), zeroPoint: -64 });
    expect(activationParams({ min: 0, max: 2.55 }, "int8")).toEqual({ scale: f32(2.55 / 255), zeroPoint: -128 });
    expect([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4, -2.6].map(roundHalfEven)).toEqual([0, 2, 2, 0, -2, -2, 2, -3]);
  });
});

describe("quantizeModel on a tiny model", () => {
  const fp32 = tinyModel();
  const { model, plan, params } = quantizeModel(fp32, { ranges: RANGES });

  it("plans QDQ on the activations between int8 ops; the ReLU is folded, the classifier and graph output stay fp32", () => {
    expect(plan.tensors).toEqual(["input", "r1", "c2", "c3", "s", "g"]);
    expect(plan.nodes).toEqual(["conv1", "conv2", "conv3", "add", "gap", "flatten"]);
    expect(params.r1).toEqual({ scale: f32(6 / 255), zeroPoint: 0 });
    expect(params.c3).toEqual({ scale: f32(4 / 255), zeroPoint: 191 });
  });

  it("writes a QuantizeLinear/DequantizeLinear pair per planned tensor with its scale and zero point", () => {
    const g = model.graph!;
    for (const t of plan.tensors) {
      const q = g.node.find((n) => n.opType === "QuantizeLinear" && n.input[0] === t);
      expect(q?.input).toEqual([t, `${t}_scale`, `${t}_zero_point`]);
      const dq = g.node.find((n) => n.opType === "DequantizeLinear" && n.input[0] === q!.output[0]);
      expect(dq?.output).toEqual([`${t}_dequantized`]);
      expect(tensorValues(init(model, `${t}_scale`))).toEqual([params[t]!.scale]);
      expect(tensorValues(init(model, `${t}_zero_point`))).toEqual([params[t]!.zeroPoint]);
      expect(init(model, `${t}_zero_point`).dataType).toBe(2); // UINT8
      // every reader of t now reads the dequantized copy
      expect(g.node.filter((n) => n !== q && n.input.includes(t))).toEqual([]);
    }
    expect(g.node.some((n) => n.input.includes("c1_dequantized"))).toBe(false);
    expect(countOps(model)).toMatchObject({ QuantizeLinear: 6, DequantizeLinear: 6 + 3 + 1, Relu: 1, Gemm: 1 });
  });

  it("quantizes weights per output channel, symmetric int8 (zero points 0), biases int32 at x_scale × w_scale", () => {
    expect(tensorValues(init(model, "w1_scale"))).toEqual([1, 2, 3, 4].map((a) => f32(a / 127)));
    expect(tensorValues(init(model, "w1_zero_point"))).toEqual([0, 0, 0, 0]);
    expect(init(model, "w1_quantized").dataType).toBe(3); // INT8
    // channel 1 weights 2, -1, 0.25 at scale 2/127 → 127, -64 (−63.5 half to even), 16 (15.875)
    expect(tensorValues(init(model, "w1_quantized")).slice(3, 6)).toEqual([127, -64, 16]);
    expect(tensorValues(init(model, "w2_scale"))[0]).toBe(f32(0.5 / 127));
    const dqw = model.graph!.node.find((n) => n.output[0] === "w1_dequantized")!;
    expect(dqw.attribute.find((a) => a.name === "axis")?.i).toBe(0n);
    // the classifier's weights stay fp32
    expect(init(model, "wfc").dataType).toBe(1);
    expect(model.graph!.initializer.some((t) => t.name === "wfc_quantized")).toBe(false);
    const bs = tensorValues(init(model, "b1_scale"));
    expect(bs).toEqual([1, 2, 3, 4].map((a) => f32(f32(4 / 255) * f32(a / 127))));
    expect(tensorValues(init(model, "b1_quantized"))).toEqual(
      [0.1, -0.2, 0.3, 0].map((b, c) => Math.round(b / bs[c]!)),
    );
    expect(init(model, "b1_quantized").dataType).toBe(6); // INT32
  });

  it("loads in ONNX Runtime, which fuses the QDQ groups into QLinearConv/QLinearAdd, and stays close to fp32", async () => {
    const dir = await mkdtemp(join(tmpdir(), "quantize-"));
    try {
      const bytes = toBinary(ModelProtoSchema, model);
      const optimized = join(dir, "opt.onnx");
      await writeOptimizedGraph(bytes, optimized);
      const ops = countOps(fromBinary(ModelProtoSchema, new Uint8Array(await readFile(optimized))));
      expect(ops["com.microsoft:QLinearConv"]).toBe(3);
      expect(ops["com.microsoft:QLinearAdd"]).toBe(1);
      expect(ops.Conv ?? 0).toBe(0);
      expect(ops.Relu ?? 0).toBe(0);

      const x = new Float32Array(3 * 64).map((_, i) => Math.sin(i) * 1.5);
      const run = async (b: Uint8Array) => {
        const s = await ort.InferenceSession.create(b);
        const r = await s.run({ input: new ort.Tensor("float32", x, [1, 3, 8, 8]) });
        await s.release();
        return r.output!.data as Float32Array;
      };
      const a = await run(toBinary(ModelProtoSchema, fp32));
      const q = await run(bytes);
      expect(q.length).toBe(3);
      for (let i = 0; i < 3; i++) expect(Math.abs(q[i]! - a[i]!)).toBeLessThan(0.15 * Math.max(1, Math.abs(a[i]!)));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("stores weights as uint8 + 128 with zero point 128 (weightType uint8): fused as QLinearConv, computing what int8 does", async () => {
    const u8 = quantizeModel(fp32, { ranges: RANGES, weightType: "uint8" }).model;
    expect(init(u8, "w1_quantized").dataType).toBe(2); // UINT8
    expect(init(u8, "w1_zero_point").dataType).toBe(2);
    expect(tensorValues(init(u8, "w1_zero_point"))).toEqual([128, 128, 128, 128]);
    expect(tensorValues(init(u8, "w1_quantized"))).toEqual(
      tensorValues(init(model, "w1_quantized")).map((q) => q + 128),
    );
    expect(tensorValues(init(u8, "w1_scale"))).toEqual(tensorValues(init(model, "w1_scale")));
    expect(tensorValues(init(u8, "b1_quantized"))).toEqual(tensorValues(init(model, "b1_quantized")));
    const dir = await mkdtemp(join(tmpdir(), "quantize-"));
    try {
      const optimized = join(dir, "opt.onnx");
      await writeOptimizedGraph(toBinary(ModelProtoSchema, u8), optimized);
      const ops = countOps(fromBinary(ModelProtoSchema, new Uint8Array(await readFile(optimized))));
      expect(ops["com.microsoft:QLinearConv"]).toBe(3);
      expect(ops.Conv ?? 0).toBe(0);
      // The same real weights: computed exactly (no graph optimizations), the same outputs as int8's.
      const x = new ort.Tensor(
        "float32",
        new Float32Array(3 * 64).map((_, i) => Math.cos(i) * 1.5),
        [1, 3, 8, 8],
      );
      const exact = async (m: ModelProto) => {
        const s = await ort.InferenceSession.create(toBinary(ModelProtoSchema, m), {
          graphOptimizationLevel: "disabled",
        });
        const y = [...((await s.run({ input: x })).output!.data as Float32Array)];
        await s.release();
        return y;
      };
      expect(await exact(u8)).toEqual(await exact(model));
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("needs a range for every planned tensor", () => {
    expect(() => quantizeModel(fp32, { ranges: { input: { min: 0, max: 1 } } })).toThrow("no calibrated range for r1");
  });

  it("keeps a weight read by an fp32 op as an fp32 initializer too", () => {
    expect(planQuantization(fp32).tensors).toContain("input");
    expect(model.graph!.initializer.some((t) => t.name === "w1")).toBe(false);
  });
});

describe("foldBatchNorms", () => {
  it("folds a BatchNormalization into the Conv before it; ONNX Runtime computes the same outputs", async () => {
    const graph = create(GraphProtoSchema, {
      name: "bn",
      node: [
        node("Conv", "conv", ["input", "w"], ["c"], { kernel_shape: [1, 1] }),
        node("BatchNormalization", "bn", ["c", "gamma", "beta", "mean", "var"], ["output"], { epsilon: 1e-5 }, [
          "epsilon",
        ]),
      ],
      initializer: [
        floatTensor("w", [2, 3, 1, 1], Float32Array.of(1, -1, 0.5, 0.25, 2, -0.5)),
        floatTensor("gamma", [2], Float32Array.of(2, 0.5)),
        floatTensor("beta", [2], Float32Array.of(0.1, -0.3)),
        floatTensor("mean", [2], Float32Array.of(0.2, -1)),
        floatTensor("var", [2], Float32Array.of(4, 0.25)),
      ],
      input: [floatValueInfo("input", [1, 3, 2, 2])],
      output: [floatValueInfo("output", [1, 2, 2, 2])],
    });
    const m = create(ModelProtoSchema, {
      irVersion: 7n,
      opsetImport: [create(OperatorSetIdProtoSchema, { domain: "", version: 13n })],
      graph,
    });
    const before = toBinary(ModelProtoSchema, m);
    expect(foldBatchNorms(m)).toBe(1);
    expect(countOps(m)).toEqual({ Conv: 1 });
    const x = new ort.Tensor("float32", Float32Array.of(1, 2, 3, 4, -1, 0, 1, 2, 0.5, 0.5, -2, 3), [1, 3, 2, 2]);
    const run = async (b: Uint8Array) => {
      const s = await ort.InferenceSession.create(b, { graphOptimizationLevel: "disabled" });
      const y = (await s.run({ input: x })).output!.data as Float32Array;
      await s.release();
      return [...y];
    };
    const a = await run(before);
    const b = await run(toBinary(ModelProtoSchema, m));
    for (const [i, v] of b.entries()) expect(v).toBeCloseTo(a[i]!, 5);
  });
});

describe("equalizeDepthwiseInputs", () => {
  /** input [1,2,4,4] → Conv 2→4 (1×1, bias) → act → depthwise Conv 4 (3×3, group 4, pad 1) → output */
  function depthwiseModel(act: "Relu" | "Clip", consumerGroup = 4): ModelProto {
    const w1 = Float32Array.from({ length: 8 }, (_, i) => (i % 3) - 0.5 + i / 10);
    const wd = Float32Array.from({ length: 4 * (4 / consumerGroup) * 9 }, (_, i) => ((i % 5) - 2) / 4);
    const graph = create(GraphProtoSchema, {
      name: "dw",
      node: [
        node("Conv", "pw", ["input", "w1", "b1"], ["c1"], { kernel_shape: [1, 1] }),
        act === "Relu" ? node("Relu", "act", ["c1"], ["a1"]) : node("Clip", "act", ["c1", "lo", "hi"], ["a1"]),
        node("Conv", "dw", ["a1", "wd"], ["output"], {
          kernel_shape: [3, 3],
          pads: [1, 1, 1, 1],
          group: consumerGroup,
        }),
      ],
      initializer: [
        floatTensor("w1", [4, 2, 1, 1], w1),
        floatTensor("b1", [4], Float32Array.of(0.5, -0.25, 0.125, 1)),
        floatTensor("wd", [4, 4 / consumerGroup, 3, 3], wd),
        floatTensor("lo", [], Float32Array.of(0)),
        floatTensor("hi", [], Float32Array.of(100)),
      ],
      input: [floatValueInfo("input", [1, 2, 4, 4])],
      output: [floatValueInfo("output", [1, 4, 4, 4])],
    });
    return create(ModelProtoSchema, {
      irVersion: 7n,
      opsetImport: [create(OperatorSetIdProtoSchema, { domain: "", version: 13n })],
      graph,
    });
  }
  const values = (m: ModelProto, name: string) => tensorValues(init(m, name));

  it("finds a Conv → Relu/Clip(0, …) → depthwise Conv chain, and not one into a grouped or full Conv", () => {
    expect(depthwiseInputs(depthwiseModel("Relu")).map((d) => d.tensor)).toEqual(["a1"]);
    expect(depthwiseInputs(depthwiseModel("Clip")).map((d) => d.tensor)).toEqual(["a1"]);
    expect(depthwiseInputs(depthwiseModel("Relu", 2))).toEqual([]);
    expect(depthwiseInputs(depthwiseModel("Relu", 1))).toEqual([]);
  });

  it("scales channel c by min(32, R / (headroom × r_c)) ≥ 1: producer row and bias up, depthwise filter down", () => {
    const m = depthwiseModel("Relu");
    const before = structuredClone({ w1: values(m, "w1"), b1: values(m, "b1"), wd: values(m, "wd") });
    // R = 4: factors 1, 4, 32 (capped: 4 / 0.01 = 400), 2 with headroom 1
    expect(equalizeDepthwiseInputs(m, { a1: Float64Array.of(4, 1, 0.01, 2) })).toBe(1);
    const f = [1, 4, 32, 2];
    expect(values(m, "w1")).toEqual(before.w1.map((v, i) => f32(v * f[Math.floor(i / 2)]!)));
    expect(values(m, "b1")).toEqual(before.b1.map((v, i) => f32(v * f[i]!)));
    expect(values(m, "wd")).toEqual(before.wd.map((v, i) => f32(v / f[Math.floor(i / 9)]!)));
    // headroom 2: R / (2 r_c) → 1 (floored), 2, 32, 1
    const h = depthwiseModel("Relu");
    equalizeDepthwiseInputs(h, { a1: Float64Array.of(4, 1, 0.01, 2) }, { headroom: 2 });
    expect(values(h, "b1")).toEqual(before.b1.map((v, i) => f32(v * [1, 2, 32, 1][i]!)));
  });

  it("leaves the fp32 outputs as they were (ONNX Runtime, through a Relu and through a wide Clip)", async () => {
    const x = new ort.Tensor(
      "float32",
      Float32Array.from({ length: 32 }, (_, i) => Math.sin(i) * 2),
      [1, 2, 4, 4],
    );
    const run = async (m: ModelProto) => {
      const s = await ort.InferenceSession.create(toBinary(ModelProtoSchema, m), {
        graphOptimizationLevel: "disabled",
      });
      const y = (await s.run({ input: x })).output!.data as Float32Array;
      await s.release();
      return [...y];
    };
    for (const act of ["Relu", "Clip"] as const) {
      const m = depthwiseModel(act);
      const a = await run(m);
      expect(equalizeDepthwiseInputs(m, { a1: Float64Array.of(3, 0.5, 0.1, 1) })).toBe(1);
      const b = await run(m);
      for (const [i, v] of b.entries()) expect(v).toBeCloseTo(a[i]!, 4);
    }
  });
});

describe("quantizeFile: calibration on photos through the seed preprocessing", () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), "quantize-file-"));
    await writeFile(join(dir, "fp32.onnx"), toBinary(ModelProtoSchema, tinyModel(224)));
    await writeFile(
      join(dir, "calib.txt"),
      ["chelsea.jpg", "truncated.jpg", "coffee.png"].map((f) => join(fixtureImagesDir, f)).join("\n"),
    );
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it("is deterministic: the same model and photos give byte-identical files (minmax, percentile, mse)", async () => {
    for (const method of ["minmax", "percentile", "mse"] as const) {
      const run = async (n: number) => {
        const out = join(dir, `${method}-${n}.onnx`);
        const r = await quantizeFile({
          model: join(dir, "fp32.onnx"),
          calibration: join(dir, "calib.txt"),
          out,
          method,
        });
        return { r, bytes: new Uint8Array(await readFile(out)) };
      };
      const a = await run(1);
      const b = await run(2);
      expect(sha(a.bytes)).toBe(sha(b.bytes));
      expect(a.r.sha256).toBe(sha(a.bytes));
      expect(a.r.calibrationImages.map((f) => f.split("/").pop())).toEqual(["chelsea.jpg", "coffee.png"]);
      // the truncated JPEG is refused by the seed preprocessing and left out, with its reason
      expect(a.r.skippedImages.map((s) => s.file.split("/").pop())).toEqual(["truncated.jpg"]);
      // the seed preprocessing's input range: (0/255 − 0.485)/0.229 … (255/255 − 0.406)/0.225
      const input = a.r.layers.find((l) => l.tensor === "input")!;
      expect(input.observed.min).toBeGreaterThanOrEqual(f32(-0.485 / 0.229) - 1e-6);
      expect(input.observed.max).toBeLessThanOrEqual(f32(0.594 / 0.225) + 1e-6);
      expect(a.r.ortOptimizedOps["com.microsoft:QLinearConv"]).toBe(3);
      for (const l of a.r.layers) {
        // an outlier-robust range never exceeds the observed one; min-max covers it (to within a step)
        expect(l.quantized.max).toBeLessThanOrEqual(Math.max(l.observed.max, 0) + l.scale + 1e-6);
        if (method === "minmax") expect(l.quantized.max).toBeGreaterThanOrEqual(l.observed.max - l.scale);
      }
    }
  });
});

describe("dequantizeModel: the shared MobileNetV2 int8 (QOperator) back to fp32", () => {
  it("leaves no quantized op, folds ReLU6 as Clip, and classifies the fixtures as the int8 model does", async () => {
    const int8 = new Uint8Array(await readFile(MOBILENET_PATH));
    const fp32 = dequantizeModel(fromBinary(ModelProtoSchema, int8));
    const ops = countOps(fp32);
    expect(Object.keys(ops).filter((k) => /QLinear|Quantize|Dequantize/.test(k))).toEqual([]);
    expect(ops.Conv).toBe(52);
    expect(ops.Clip).toBe(35);
    expect(fp32.graph!.initializer.every((t) => t.dataType === 1 || t.dataType === 7)).toBe(true);
    const s = await ort.InferenceSession.create(toBinary(ModelProtoSchema, fp32));
    const expected: Record<string, number> = {
      "chelsea.jpg": 285,
      "coffee.jpg": 967,
      "camera.jpg": 872,
      "motorcycle_left.jpg": 665,
    };
    for (const [f, cls] of Object.entries(expected)) {
      const x = readReferenceTensor(f);
      const y = (await s.run({ input: new ort.Tensor("float32", x, [1, 3, 224, 224]) })).output!.data as Float32Array;
      expect([f, y.indexOf(Math.max(...y))]).toEqual([f, cls]);
    }
    await s.release();
  });
});
