/**
 * `pnpm models:synth`: a ResNet-50 v1.5 ONNX model with torchvision's exact
 * topology and parameter count (25,557,032) but seeded random weights, so
 * the pipeline runs and benchmarks offline, with no Python. Its
 * predictions mean nothing; the file says so in doc_string and in
 * metadata_props `trellis.synthetic` = "true".
 */
import { createHash } from "node:crypto";
import { mkdir, rename, writeFile } from "node:fs/promises";
import { dirname } from "node:path";
import { create, toBinary } from "@bufbuild/protobuf";
import {
  floatTensor,
  floatValueInfo,
  GraphProtoSchema,
  type ModelProto,
  ModelProtoSchema,
  type NodeProto,
  node,
  OperatorSetIdProtoSchema,
  StringStringEntryProtoSchema,
  SYNTHETIC_METADATA_KEY,
  type TensorProto,
} from "./onnx.js";

/** torchvision.models.resnet50().parameters() summed (running stats are buffers, not parameters). */
export const RESNET50_PARAMETERS = 25_557_032;
export const SYNTH_OPSET = 13;
export const SYNTH_IR_VERSION = 7;
export const SYNTH_INPUT = "input";
export const SYNTH_OUTPUT = "output";

/** Mulberry32: a small, fast, well-mixed 32-bit PRNG; plenty for weights. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

class Builder {
  readonly nodes: NodeProto[] = [];
  readonly initializers: TensorProto[] = [];
  private readonly rand: () => number;

  constructor(seed: number) {
    this.rand = prng(seed);
  }

  /** uniform(-bound, bound) */
  private uniform(n: number, bound: number): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = (this.rand() * 2 - 1) * bound;
    return a;
  }

  private around(n: number, center: number, spread: number): Float32Array {
    const a = new Float32Array(n);
    for (let i = 0; i < n; i++) a[i] = center + (this.rand() * 2 - 1) * spread;
    return a;
  }

  /** Conv without bias, He-uniform (bound sqrt(6/fan_in)) so ReLU activations keep their scale. */
  conv(name: string, x: string, cin: number, cout: number, k: number, stride: number, pad: number): string {
    const w = `${name}.weight`;
    const fanIn = cin * k * k;
    this.initializers.push(floatTensor(w, [cout, cin, k, k], this.uniform(cout * fanIn, Math.sqrt(6 / fanIn))));
    const y = `${name}.out`;
    this.nodes.push(
      node("Conv", name, [x, w], [y], {
        dilations: [1, 1],
        group: 1,
        kernel_shape: [k, k],
        pads: [pad, pad, pad, pad],
        strides: [stride, stride],
      }),
    );
    return y;
  }

  /**
   * BatchNormalization in inference form. gamma/beta are parameters; the
   * running statistics are buffers. `gamma` scales the branch: the last BN
   * of each residual branch gets a small one (like torchvision's
   * zero_init_residual, but not zero) so 16 residual additions do not blow
   * activations up.
   */
  bn(name: string, x: string, c: number, gamma = 1): string {
    const names = ["weight", "bias", "running_mean", "running_var"].map((s) => `${name}.${s}`);
    this.initializers.push(
      floatTensor(names[0]!, [c], this.around(c, gamma, gamma * 0.1)),
      floatTensor(names[1]!, [c], this.uniform(c, 0.05)),
      floatTensor(names[2]!, [c], this.uniform(c, 0.05)),
      floatTensor(names[3]!, [c], this.around(c, 1, 0.1)),
    );
    const y = `${name}.out`;
    this.nodes.push(
      node("BatchNormalization", name, [x, ...names], [y], { epsilon: 1e-5, momentum: 0.9 }, ["epsilon", "momentum"]),
    );
    return y;
  }

  relu(name: string, x: string): string {
    const y = `${name}.out`;
    this.nodes.push(node("Relu", name, [x], [y]));
    return y;
  }

  /** torchvision Bottleneck (v1.5: the stride sits on the 3x3 conv). */
  bottleneck(prefix: string, x: string, inplanes: number, planes: number, stride: number): string {
    let y = this.relu(
      `${prefix}.relu1`,
      this.bn(`${prefix}.bn1`, this.conv(`${prefix}.conv1`, x, inplanes, planes, 1, 1, 0), planes),
    );
    y = this.relu(
      `${prefix}.relu2`,
      this.bn(`${prefix}.bn2`, this.conv(`${prefix}.conv2`, y, planes, planes, 3, stride, 1), planes),
    );
    y = this.bn(`${prefix}.bn3`, this.conv(`${prefix}.conv3`, y, planes, planes * 4, 1, 1, 0), planes * 4, 0.2);
    let identity = x;
    if (stride !== 1 || inplanes !== planes * 4) {
      identity = this.bn(
        `${prefix}.downsample.1`,
        this.conv(`${prefix}.downsample.0`, x, inplanes, planes * 4, 1, stride, 0),
        planes * 4,
      );
    }
    const sum = `${prefix}.add.out`;
    this.nodes.push(node("Add", `${prefix}.add`, [y, identity], [sum]));
    return this.relu(`${prefix}.relu3`, sum);
  }
}

export interface SynthModelOptions {
  /** PRNG seed; same seed, same bytes. Default 0. */
  seed?: number;
}

/** The synthetic ResNet-50 as a ModelProto (weights are views, nothing written). */
export function buildResNet50({ seed = 0 }: SynthModelOptions = {}): ModelProto {
  const b = new Builder(seed);
  let x = b.conv("conv1", SYNTH_INPUT, 3, 64, 7, 2, 3);
  x = b.relu("relu", b.bn("bn1", x, 64));
  b.nodes.push(
    node("MaxPool", "maxpool", [x], ["maxpool.out"], { kernel_shape: [3, 3], pads: [1, 1, 1, 1], strides: [2, 2] }),
  );
  x = "maxpool.out";
  let inplanes = 64;
  const layers: [number, number, number][] = [
    [64, 3, 1],
    [128, 4, 2],
    [256, 6, 2],
    [512, 3, 2],
  ];
  layers.forEach(([planes, blocks, stride], li) => {
    for (let i = 0; i < blocks; i++) {
      x = b.bottleneck(`layer${li + 1}.${i}`, x, inplanes, planes, i === 0 ? stride : 1);
      inplanes = planes * 4;
    }
  });
  b.nodes.push(node("GlobalAveragePool", "avgpool", [x], ["avgpool.out"]));
  b.nodes.push(node("Flatten", "flatten", ["avgpool.out"], ["flatten.out"], { axis: 1 }));
  // torch.nn.Linear's default init: uniform(+-1/sqrt(fan_in)) for weight and bias.
  const bound = 1 / Math.sqrt(2048);
  const fcW = new Float32Array(1000 * 2048);
  const fcB = new Float32Array(1000);
  const rand = prng(seed ^ 0x5eed);
  for (let i = 0; i < fcW.length; i++) fcW[i] = (rand() * 2 - 1) * bound;
  for (let i = 0; i < fcB.length; i++) fcB[i] = (rand() * 2 - 1) * bound;
  b.initializers.push(floatTensor("fc.weight", [1000, 2048], fcW), floatTensor("fc.bias", [1000], fcB));
  b.nodes.push(
    node("Gemm", "fc", ["flatten.out", "fc.weight", "fc.bias"], [SYNTH_OUTPUT], { alpha: 1, beta: 1, transB: 1 }, [
      "alpha",
      "beta",
    ]),
  );

  const doc = `SYNTHETIC ResNet-50 v1.5 (torchvision topology, ${RESNET50_PARAMETERS} parameters) with seeded random weights (seed ${seed}). Its predictions are meaningless; run \`pnpm models:fetch\` for the real model.`;
  return create(ModelProtoSchema, {
    irVersion: BigInt(SYNTH_IR_VERSION),
    opsetImport: [create(OperatorSetIdProtoSchema, { domain: "", version: BigInt(SYNTH_OPSET) })],
    producerName: "trellis-tooling",
    producerVersion: "0.1.0",
    docString: doc,
    metadataProps: [
      create(StringStringEntryProtoSchema, { key: SYNTHETIC_METADATA_KEY, value: "true" }),
      create(StringStringEntryProtoSchema, { key: "trellis.seed", value: String(seed) }),
      create(StringStringEntryProtoSchema, { key: "trellis.architecture", value: "resnet50-v1.5" }),
    ],
    graph: create(GraphProtoSchema, {
      name: "resnet50_synthetic",
      docString: doc,
      node: b.nodes,
      initializer: b.initializers,
      input: [floatValueInfo(SYNTH_INPUT, ["N", 3, 224, 224])],
      output: [floatValueInfo(SYNTH_OUTPUT, ["N", 1000])],
    }),
  });
}

/** Trainable parameters in a model's initializers, counting as torchvision does (no BN running stats). */
export function countParameters(model: ModelProto): number {
  let n = 0;
  for (const t of model.graph?.initializer ?? []) {
    const name = t.name ?? "";
    if (name.endsWith(".running_mean") || name.endsWith(".running_var")) continue;
    n += t.dims.reduce((a, d) => a * Number(d), 1);
  }
  return n;
}

export interface SynthesizeOptions extends SynthModelOptions {
  /** Where to write model.onnx (folders are created). */
  path: string;
}

export interface SynthesizeResult {
  path: string;
  seed: number;
  bytes: number;
  parameters: number;
  sha256: string;
  ms: number;
}

/** Writes the synthetic ResNet-50 to `path` (via `path.part`, then rename, so a crash leaves no half file). */
export async function synthesizeResNet50({ seed = 0, path }: SynthesizeOptions): Promise<SynthesizeResult> {
  const t0 = performance.now();
  const model = buildResNet50({ seed });
  const bytes = toBinary(ModelProtoSchema, model);
  await mkdir(dirname(path), { recursive: true });
  await writeFile(`${path}.part`, bytes);
  await rename(`${path}.part`, path);
  return {
    path,
    seed,
    bytes: bytes.byteLength,
    parameters: countParameters(model),
    sha256: createHash("sha256").update(bytes).digest("hex"),
    ms: performance.now() - t0,
  };
}

/**
 * Stand-in labels `synthetic_class_<i>`, written only where no label file
 * exists (real labels come from `models:fetch`). Returns whether it wrote.
 */
export async function writeSyntheticLabels(path: string, count = 1000): Promise<boolean> {
  await mkdir(dirname(path), { recursive: true });
  const text = Array.from({ length: count }, (_, i) => `synthetic_class_${i}`).join("\n");
  try {
    await writeFile(path, text, { flag: "wx" });
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw err;
  }
}
