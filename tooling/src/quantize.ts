/**
 * Static post-training quantization on our ONNX protobuf subset: an fp32 model to QDQ int8
 * (per-channel symmetric int8 weights for Conv/Gemm/MatMul, per-tensor activations from
 * calibrated ranges), and the reverse for the QOperator int8 models of the ONNX Model Zoo
 * (QLinearConv & co. back to an fp32 graph with the weights dequantized).
 *
 * Pure graph work: no ONNX Runtime here (calibration runs the model, see calibrate.ts).
 * Same model + same ranges → byte-identical output.
 */
import { clone, create } from "@bufbuild/protobuf";
import {
  type ModelProto,
  ModelProtoSchema,
  type NodeProto,
  NodeProtoSchema,
  OperatorSetIdProtoSchema,
  StringStringEntryProtoSchema,
  type TensorProto,
  TensorProto_DataType,
  TensorProtoSchema,
  TypeProto_TensorSchema,
  TypeProtoSchema,
  ValueInfoProtoSchema,
} from "./gen/onnx_pb.js";
import { floatTensor, node } from "./onnx.js";

export type ActivationType = "uint8" | "int8";

export interface QuantParams {
  scale: number;
  zeroPoint: number;
}

/** Observed (or chosen) range of one activation tensor. */
export interface TensorRange {
  min: number;
  max: number;
}

// ---------------------------------------------------------------- numbers

/** numpy's rounding: half to even. */
export function roundHalfEven(x: number): number {
  const r = Math.round(x);
  return (Math.abs(x % 1) === 0.5 && r % 2 !== 0 ? r - 1 : r) + 0; // + 0: no -0
}

const clamp = (v: number, lo: number, hi: number) => (v < lo ? lo : Math.min(v, hi));

export function qRange(type: ActivationType): [number, number] {
  return type === "uint8" ? [0, 255] : [-128, 127];
}

/**
 * Asymmetric per-tensor parameters for an activation range, as ONNX Runtime's quantizer
 * computes them: the range is widened to include 0 (so 0 is exact), scale = (max − min) /
 * (qmax − qmin) rounded to float32, zero point = round(qmin − min / scale).
 */
export function activationParams(range: TensorRange, type: ActivationType = "uint8"): QuantParams {
  const [qmin, qmax] = qRange(type);
  const lo = Math.min(range.min, 0);
  const hi = Math.max(range.max, 0);
  if (!(hi > lo)) return { scale: 1, zeroPoint: type === "uint8" ? 0 : 0 };
  const scale = Math.fround((hi - lo) / (qmax - qmin));
  return { scale, zeroPoint: clamp(roundHalfEven(qmin - lo / scale), qmin, qmax) };
}

/** Symmetric int8 scale for weights with largest magnitude `absMax`: absMax / 127 (zero point 0). */
export function weightScale(absMax: number, qmax = 127): number {
  return absMax > 0 ? Math.fround(absMax / qmax) : 1;
}

// ---------------------------------------------------------------- tensors

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

function intTensor(name: string, dims: number[], type: TensorProto_DataType, data: ArrayBufferView): TensorProto {
  if (!LITTLE_ENDIAN) throw new Error("writing ONNX raw_data needs a little-endian host");
  return create(TensorProtoSchema, {
    name,
    dims: dims.map(BigInt),
    dataType: type,
    rawData: new Uint8Array(data.buffer, data.byteOffset, data.byteLength),
  });
}

function zeroPointTensor(name: string, type: ActivationType, zp: number): TensorProto {
  return type === "uint8"
    ? intTensor(name, [], TensorProto_DataType.UINT8, Uint8Array.of(zp))
    : intTensor(name, [], TensorProto_DataType.INT8, Int8Array.of(zp));
}

/** The elements of an initializer as float64 numbers (FLOAT, (U)INT8, INT32, INT64). */
export function tensorValues(t: TensorProto): number[] {
  const raw = t.rawData ?? new Uint8Array();
  const count = t.dims.reduce((a, d) => a * Number(d), 1);
  const view = raw.length ? new DataView(raw.buffer, raw.byteOffset, raw.byteLength) : undefined;
  const out: number[] = new Array(count);
  switch (t.dataType) {
    case TensorProto_DataType.FLOAT:
      for (let i = 0; i < count; i++) out[i] = view ? view.getFloat32(i * 4, true) : t.floatData[i]!;
      return out;
    case TensorProto_DataType.UINT8:
      for (let i = 0; i < count; i++) out[i] = view ? view.getUint8(i) : t.int32Data[i]!;
      return out;
    case TensorProto_DataType.INT8:
      for (let i = 0; i < count; i++) out[i] = view ? view.getInt8(i) : t.int32Data[i]!;
      return out;
    case TensorProto_DataType.INT32:
      for (let i = 0; i < count; i++) out[i] = view ? view.getInt32(i * 4, true) : t.int32Data[i]!;
      return out;
    case TensorProto_DataType.INT64:
      for (let i = 0; i < count; i++) out[i] = view ? Number(view.getBigInt64(i * 8, true)) : Number(t.int64Data[i]!);
      return out;
    default:
      throw new Error(`initializer ${t.name!}: data type ${t.dataType} not supported`);
  }
}

function attrInt(n: NodeProto, name: string, dflt: number): number {
  const a = n.attribute.find((x) => x.name === name);
  return a ? Number(a.i) : dflt;
}

function attrInts(n: NodeProto, name: string): number[] | undefined {
  const a = n.attribute.find((x) => x.name === name);
  return a ? a.ints.map(Number) : undefined;
}

function opsetOf(model: ModelProto): number {
  const o = model.opsetImport.find((x) => (x.domain ?? "") === "" || x.domain === "ai.onnx");
  return o ? Number(o.version) : 1;
}

/**
 * Per-channel QuantizeLinear/DequantizeLinear (the `axis` attribute) needs opset 13. Raises an
 * older model to 13, moving the `axes`/`split` attributes that became inputs; refuses ops whose
 * meaning changed (Softmax & co.) rather than alter the network.
 */
export function upgradeToOpset13(model: ModelProto): void {
  const from = opsetOf(model);
  if (from >= 13) return;
  const g = model.graph!;
  for (const n of g.node) {
    if ((n.domain ?? "") !== "") continue;
    if (["Softmax", "LogSoftmax", "Hardmax"].includes(n.opType!)) {
      throw new Error(`cannot raise opset ${from} to 13: ${n.opType!} ${n.name} changed meaning in opset 13`);
    }
    const moved = { Unsqueeze: "axes", Squeeze: "axes", ReduceSum: "axes", Split: "split" }[n.opType!];
    const values = moved ? attrInts(n, moved) : undefined;
    if (moved && values) {
      const name = `${n.output[0]}_${moved}`;
      g.initializer.push(
        intTensor(name, [values.length], TensorProto_DataType.INT64, BigInt64Array.from(values.map(BigInt))),
      );
      n.attribute = n.attribute.filter((a) => a.name !== moved);
      n.input.push(name);
    }
  }
  model.opsetImport = [
    create(OperatorSetIdProtoSchema, { domain: "", version: 13n }),
    ...model.opsetImport.filter((o) => (o.domain ?? "") !== "" && o.domain !== "ai.onnx"),
  ];
}

// ---------------------------------------------------------------- dequantize (QOperator → fp32)

/**
 * An fp32 model from a QOperator int8 model (QuantizeLinear → QLinearConv/QLinearAdd/
 * QLinearMatMul/QLinearGlobalAveragePool → DequantizeLinear, as the Model Zoo's int8 models):
 * every int8 weight becomes an fp32 initializer `scale × (q − zero_point)`, an int32 bias
 * `q × x_scale × w_scale`, and each QLinear op its fp32 op; the Quantize/DequantizeLinear at the
 * edges are dropped. A QLinearConv whose output zero point is the type's minimum had a ReLU
 * folded into its output range: it becomes Conv + Clip(0, (qmax − zp) × scale) (ReLU6 in
 * MobileNetV2). The result is opset 13.
 */
export function dequantizeModel(input: ModelProto): ModelProto {
  const model = clone(ModelProtoSchema, input);
  const g = model.graph!;
  const inits = new Map(g.initializer.map((t) => [t.name!, t]));
  const values = (name: string) => {
    const t = inits.get(name);
    if (!t) throw new Error(`dequantize: ${name} is not an initializer`);
    return tensorValues(t);
  };
  const dims = (name: string) => inits.get(name)!.dims.map(Number);
  const isUint8 = (name: string) => inits.get(name)?.dataType === TensorProto_DataType.UINT8;
  const rename = new Map<string, string>();
  const fp = (name: string) => rename.get(name) ?? name;
  const newInits: TensorProto[] = [];
  const used = new Set<string>();

  /** fp32 copy of a (per-tensor or per-channel along `axis`) quantized initializer. */
  const dequantInit = (q: string, s: string, zp: string, axis: number): string => {
    const name = q.replace(/_quantized$/, "");
    const qv = values(q);
    const sv = values(s);
    const zv = values(zp);
    const d = dims(q);
    const inner = d.slice(axis + 1).reduce((a, b) => a * b, 1);
    const out = new Float32Array(qv.length);
    for (let i = 0; i < qv.length; i++) {
      const c = sv.length === 1 ? 0 : Math.floor(i / inner) % sv.length;
      out[i] = sv[c]! * (qv[i]! - zv[zv.length === 1 ? 0 : c]!);
    }
    newInits.push(floatTensor(name, d, out));
    return name;
  };

  const nodes: NodeProto[] = [];
  for (const n of g.node) {
    const i = n.input;
    switch (n.opType!) {
      case "QuantizeLinear":
        rename.set(n.output[0]!, fp(i[0]!));
        break;
      case "DequantizeLinear":
        if (inits.has(i[0]!)) {
          rename.set(n.output[0]!, dequantInit(i[0]!, i[1]!, i[2]!, attrInt(n, "axis", 1)));
        } else {
          // the graph output keeps its name: the fp32 producer writes it directly
          rename.set(i[0]!, n.output[0]!);
        }
        break;
      default:
        nodes.push(n);
    }
  }
  // second pass: names produced by QLinear ops are the dequantized tensor names
  const out: NodeProto[] = [];
  const outName = (q: string) => rename.get(q) ?? q.replace(/_quantized$/, "");
  for (const n of nodes) {
    const i = n.input;
    const attrs = n.attribute.filter((a) => a.name !== "channels_last");
    switch (n.opType!) {
      case "QLinearConv": {
        const w = dequantInit(i[3]!, i[4]!, i[5]!, 0);
        const inputs = [outName(i[0]!), w];
        if (i[8]) {
          const bq = values(i[8]);
          const xs = values(i[1]!)[0]!;
          const ws = values(i[4]!);
          const b = new Float32Array(bq.length);
          for (let c = 0; c < bq.length; c++) b[c] = bq[c]! * xs * ws[ws.length === 1 ? 0 : c]!;
          const bname = i[8].replace(/_quantized$/, "");
          newInits.push(floatTensor(bname, [b.length], b));
          inputs.push(bname);
        }
        const y = outName(n.output[0]!);
        const ys = values(i[6]!)[0]!;
        const yzp = values(i[7]!)[0]!;
        const [qmin, qmax] = isUint8(i[7]!) ? [0, 255] : [-128, 127];
        if (yzp === qmin) {
          const conv = create(NodeProtoSchema, {
            ...n,
            opType: "Conv",
            domain: "",
            input: inputs,
            output: [`${y}_preact`],
            attribute: attrs,
          });
          out.push(conv);
          const lo = `${y}_clip_min`;
          const hi = `${y}_clip_max`;
          newInits.push(
            floatTensor(lo, [], Float32Array.of(0)),
            floatTensor(hi, [], Float32Array.of((qmax - yzp) * ys)),
          );
          out.push(node("Clip", `${n.name || y}_clip`, [`${y}_preact`, lo, hi], [y]));
        } else {
          out.push(
            create(NodeProtoSchema, { ...n, opType: "Conv", domain: "", input: inputs, output: [y], attribute: attrs }),
          );
        }
        break;
      }
      case "QLinearAdd":
      case "QLinearMatMul": {
        const a = inits.has(i[0]!) ? dequantInit(i[0]!, i[1]!, i[2]!, 1) : fp(outName(i[0]!));
        const b = inits.has(i[3]!) ? dequantInit(i[3]!, i[4]!, i[5]!, 1) : fp(outName(i[3]!));
        const y = outName(n.output[0]!);
        const op = n.opType! === "QLinearAdd" ? "Add" : "MatMul";
        out.push(node(op, n.name || y, [a, b], [y]));
        break;
      }
      case "QLinearGlobalAveragePool": {
        const y = outName(n.output[0]!);
        out.push(node("GlobalAveragePool", n.name || y, [fp(outName(i[0]!))], [y]));
        break;
      }
      default: {
        if (n.opType!.startsWith("QLinear") || n.opType! === "ConvInteger" || n.opType! === "MatMulInteger") {
          throw new Error(`dequantize: ${n.opType!} is not supported`);
        }
        const inputs = n.input.map((x) =>
          x === "" ? x : inits.has(x) && !x.endsWith("_quantized") ? x : fp(outName(x)),
        );
        out.push(create(NodeProtoSchema, { ...n, input: inputs, output: n.output.map(outName) }));
      }
    }
  }
  for (const n of out) for (const x of n.input) used.add(x);
  const kept = g.initializer.filter(
    (t) =>
      t.dataType !== TensorProto_DataType.UINT8 &&
      t.dataType !== TensorProto_DataType.INT8 &&
      t.dataType !== TensorProto_DataType.INT32 &&
      !t.name!.endsWith("_scale") &&
      used.has(t.name!),
  );
  const all = new Map<string, TensorProto>();
  for (const t of [...kept, ...newInits]) if (used.has(t.name!)) all.set(t.name!, t);
  g.node = out;
  g.initializer = [...all.values()];
  g.valueInfo = [];
  const inputNames = new Set(g.initializer.map((t) => t.name!));
  g.input = g.input.filter((v) => !inputNames.has(v.name!));
  model.opsetImport = model.opsetImport.filter((o) => (o.domain ?? "") === "" || o.domain === "ai.onnx");
  upgradeToOpset13(model);
  model.metadataProps = [
    ...model.metadataProps.filter((p) => p.key !== "trellis.dequantized_from"),
    create(StringStringEntryProtoSchema, { key: "trellis.dequantized_from", value: "QOperator int8" }),
  ];
  return model;
}

// ---------------------------------------------------------------- quantize (fp32 → QDQ int8)

/**
 * Folds each BatchNormalization that alone reads a Conv's output into that Conv (W' = W·γ/√(σ²+ε)
 * per output channel, b' = (b − μ)·γ/√(σ²+ε) + β), as ONNX Runtime would before running it, so
 * that the Conv's output can be quantized. Returns how many were folded.
 */
export function foldBatchNorms(model: ModelProto): number {
  const g = model.graph!;
  const inits = new Map(g.initializer.map((t) => [t.name!, t]));
  const readers = new Map<string, number>();
  for (const n of g.node) for (const x of n.input) readers.set(x, (readers.get(x) ?? 0) + 1);
  const producer = new Map<string, NodeProto>();
  for (const n of g.node) for (const y of n.output) producer.set(y, n);
  const graphOutputs = new Set(g.output.map((o) => o.name!));
  const drop = new Set<NodeProto>();
  for (const bn of g.node) {
    if (bn.opType !== "BatchNormalization" || bn.output.length !== 1) continue;
    const conv = producer.get(bn.input[0]!);
    if (conv?.opType !== "Conv" || readers.get(bn.input[0]!) !== 1 || graphOutputs.has(bn.input[0]!)) continue;
    const [, sName, bName, mName, vName] = bn.input;
    const w = inits.get(conv.input[1]!);
    const params = [sName, bName, mName, vName].map((x) => inits.get(x!));
    if (!w || params.some((t) => !t) || (readers.get(conv.input[1]!) ?? 0) !== 1) continue;
    const [gamma, beta, mean, variance] = params.map((t) => tensorValues(t!));
    const eps = bn.attribute.find((a) => a.name === "epsilon")?.f ?? 1e-5;
    const wv = tensorValues(w);
    const m = Number(w.dims[0]);
    const inner = wv.length / m;
    const oldBias = conv.input[2] ? tensorValues(inits.get(conv.input[2])!) : new Array<number>(m).fill(0);
    const nw = new Float32Array(wv.length);
    const nb = new Float32Array(m);
    for (let c = 0; c < m; c++) {
      const k = gamma![c]! / Math.sqrt(variance![c]! + eps);
      for (let i = 0; i < inner; i++) nw[c * inner + i] = wv[c * inner + i]! * k;
      nb[c] = (oldBias[c]! - mean![c]!) * k + beta![c]!;
    }
    const wName = `${conv.input[1]}_bnfolded`;
    const bNew = `${bn.output[0]}_bias_bnfolded`;
    g.initializer.push(floatTensor(wName, w.dims.map(Number), nw), floatTensor(bNew, [m], nb));
    conv.input = [conv.input[0]!, wName, bNew];
    conv.output = [bn.output[0]!];
    drop.add(bn);
  }
  if (drop.size === 0) return 0;
  g.node = g.node.filter((n) => !drop.has(n));
  const read = new Set(g.node.flatMap((n) => n.input));
  g.initializer = g.initializer.filter((t) => read.has(t.name!));
  return drop.size;
}

/** A Conv → Relu/Clip(0, …) → depthwise Conv chain whose middle tensor can be equalized. */
export interface DepthwiseInput {
  /** the activation tensor read by the depthwise Conv */
  tensor: string;
  producer: NodeProto;
  consumer: NodeProto;
}

const isConvWithWeights = (n: NodeProto | undefined, inits: Set<string>): n is NodeProto =>
  n?.opType === "Conv" && (n.domain ?? "") === "" && !!n.input[1] && inits.has(n.input[1]);

/**
 * The activations worth equalizing: each output of a Conv through a Relu or a Clip with min 0,
 * read only by one depthwise Conv (group = channels). Their channels can be rescaled for free:
 * the producer's rows and the depthwise filters are both quantized per channel.
 */
export function depthwiseInputs(model: ModelProto): DepthwiseInput[] {
  const g = model.graph!;
  const inits = new Map(g.initializer.map((t) => [t.name!, t]));
  const names = new Set(inits.keys());
  const readers = new Map<string, NodeProto[]>();
  for (const n of g.node) for (const x of n.input) if (x) readers.set(x, [...(readers.get(x) ?? []), n]);
  const producer = new Map<string, NodeProto>();
  for (const n of g.node) for (const y of n.output) producer.set(y, n);
  const graphOutputs = new Set(g.output.map((o) => o.name!));
  const found: DepthwiseInput[] = [];
  for (const act of g.node) {
    if (act.opType !== "Relu" && act.opType !== "Clip") continue;
    if (act.opType === "Clip") {
      const min = act.input[1] ? inits.get(act.input[1]) : undefined;
      if (!min || tensorValues(min)[0] !== 0) continue;
    }
    const [x, y] = [act.input[0]!, act.output[0]!];
    const p = producer.get(x);
    const readersOfY = readers.get(y) ?? [];
    const c = readersOfY[0];
    if (!isConvWithWeights(p, names) || (readers.get(x) ?? []).length !== 1 || graphOutputs.has(x)) continue;
    if (readersOfY.length !== 1 || graphOutputs.has(y) || !isConvWithWeights(c, names) || c.input[0] !== y) continue;
    const channels = Number(inits.get(p.input[1]!)!.dims[0]);
    if (attrInt(c, "group", 1) !== channels || Number(inits.get(c.input[1]!)!.dims[0]) !== channels) continue;
    found.push({ tensor: y, producer: p, consumer: c });
  }
  return found;
}

/**
 * Depthwise-input equalization (after Nagel et al., "Data-Free Quantization", 2019, in its
 * per-channel-weights form): per-tensor activation ranges starve a channel that is small beside
 * its neighbours, so each channel c of a depthwise Conv's input is scaled up by
 * f_c = min(maxFactor, R / (headroom × r_c)) (≥ 1), where r_c is the channel's calibrated
 * absolute maximum and R the tensor's, by scaling the producer's row c and bias by f_c and the
 * depthwise filter c by 1 / f_c. Weights are quantized per channel, so theirs is unaffected; the
 * fp32 function is unchanged through a Relu, and through a Clip(0, M) until channel c passes M / f_c
 * (at least headroom × its calibrated maximum), where int8 would saturate it anyway. Returns the
 * number of tensors rescaled.
 */
export function equalizeDepthwiseInputs(
  model: ModelProto,
  channelMax: Record<string, Float64Array>,
  opts: { headroom?: number; maxFactor?: number } = {},
): number {
  const headroom = opts.headroom ?? 1;
  const maxFactor = opts.maxFactor ?? 32;
  const g = model.graph!;
  const replace = (name: string, scale: (v: number, i: number) => number) => {
    const k = g.initializer.findIndex((t) => t.name === name);
    const t = g.initializer[k]!;
    g.initializer[k] = floatTensor(name, t.dims.map(Number), Float32Array.from(tensorValues(t), scale));
  };
  let rescaled = 0;
  for (const { tensor, producer, consumer } of depthwiseInputs(model)) {
    const r = channelMax[tensor];
    if (!r) continue;
    const R = Math.max(...r);
    if (!(R > 0)) continue;
    const f = Float64Array.from(r, (rc) => Math.max(1, Math.min(maxFactor, R / (headroom * rc))));
    if (f.every((v) => v === 1)) continue;
    const perChannel = (w: string) => {
      const t = g.initializer.find((i) => i.name === w)!;
      return tensorValues(t).length / Number(t.dims[0]);
    };
    const rowLength = perChannel(producer.input[1]!);
    replace(producer.input[1]!, (v, i) => v * f[Math.floor(i / rowLength)]!);
    if (producer.input[2]) replace(producer.input[2], (v, i) => v * f[i]!);
    const filterLength = perChannel(consumer.input[1]!);
    replace(consumer.input[1]!, (v, i) => v / f[Math.floor(i / filterLength)]!);
    rescaled++;
  }
  return rescaled;
}

const WEIGHTED = new Set(["Conv", "Gemm", "MatMul"]);
/** ops ONNX Runtime runs in int8 when their inputs come from DequantizeLinear and output goes to QuantizeLinear */
const ACTIVATION_OPS = new Set(["Add", "GlobalAveragePool", "AveragePool", "Concat"]);
/** data movement (and max): output shares its input's quantization, so ONNX Runtime can drop the pair */
const PASS_THROUGH = new Set(["Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "MaxPool"]);
/** activations folded into the preceding op's output range */
const FOLDED = new Set(["Relu", "Clip"]);

export interface QuantizationPlan {
  /** activation tensors to get a QuantizeLinear/DequantizeLinear pair, in graph order */
  tensors: string[];
  /** nodes run in int8 (by name or output) */
  nodes: string[];
}

/**
 * Which activation tensors to quantize: the activation inputs of Conv/Gemm/MatMul (with an
 * initializer weight), Add, pools and pass-through reshapes, and their outputs where another
 * quantized node reads them; an output read only by a Relu/Clip moves past it (the activation
 * is folded into the quantized range, as ONNX Runtime fuses it). Graph outputs stay fp32.
 */
export function planQuantization(model: ModelProto): QuantizationPlan {
  const g = model.graph!;
  const inits = new Set(g.initializer.map((t) => t.name!));
  const consumers = new Map<string, NodeProto[]>();
  for (const n of g.node) for (const x of n.input) if (x) consumers.set(x, [...(consumers.get(x) ?? []), n]);
  const producer = new Map<string, NodeProto>();
  for (const n of g.node) for (const y of n.output) producer.set(y, n);
  const graphOutputs = new Set(g.output.map((o) => o.name!));

  const quantized = new Set<NodeProto>();
  for (const n of g.node) {
    if ((n.domain ?? "") !== "") continue;
    if (WEIGHTED.has(n.opType!)) {
      if (n.input[1] && inits.has(n.input[1]) && !inits.has(n.input[0]!)) quantized.add(n);
    } else if (ACTIVATION_OPS.has(n.opType!)) {
      const acts = n.opType! === "Concat" ? n.input : n.input.slice(0, n.opType! === "Add" ? 2 : 1);
      if (acts.every((x) => x && !inits.has(x))) quantized.add(n);
    } else if (PASS_THROUGH.has(n.opType!)) {
      const p = producer.get(n.input[0]!);
      if (p && (quantized.has(p) || (FOLDED.has(p.opType!) && quantized.has(producer.get(p.input[0]!)!))))
        quantized.add(n);
    }
  }
  const isQ = (n: NodeProto) => quantized.has(n);
  /** the tensor that carries node n's output into int8: past a folded Relu/Clip */
  const carried = (y: string): string => {
    const cs = consumers.get(y) ?? [];
    if (cs.length === 1 && FOLDED.has(cs[0]!.opType!) && !graphOutputs.has(y)) return cs[0]!.output[0]!;
    return y;
  };
  // A Conv/Gemm/MatMul whose output no int8 op reads stays fp32 (a classifier before the graph
  // output): ONNX Runtime would not fuse it, and would dequantize its weights on every run.
  for (let changed = true; changed; ) {
    changed = false;
    for (const n of g.node) {
      if (!isQ(n) || !WEIGHTED.has(n.opType!)) continue;
      if (!n.output.some((y) => (consumers.get(carried(y)) ?? []).some(isQ))) {
        quantized.delete(n);
        changed = true;
      }
    }
  }
  const tensors = new Set<string>();
  for (const n of g.node) {
    if (!isQ(n)) continue;
    const acts = WEIGHTED.has(n.opType!)
      ? [n.input[0]!]
      : PASS_THROUGH.has(n.opType!)
        ? [n.input[0]!]
        : n.input.filter((x) => x && !inits.has(x));
    for (const x of acts) tensors.add(x);
    for (const y of n.output) {
      const c = carried(y);
      if (graphOutputs.has(c)) continue;
      if ((consumers.get(c) ?? []).some(isQ)) tensors.add(c);
    }
  }
  // graph order: inputs first, then by producing node
  const order = new Map<string, number>();
  g.input.forEach((v, k) => {
    order.set(v.name!, -1 - (g.input.length - k));
  });
  g.node.forEach((n, k) => {
    for (const y of n.output) order.set(y, k);
  });
  const list = [...tensors].sort((a, b) => (order.get(a) ?? 0) - (order.get(b) ?? 0) || (a < b ? -1 : a > b ? 1 : 0));
  return { tensors: list, nodes: g.node.filter(isQ).map((n) => n.name || n.output[0]!) };
}

/** A copy of the model whose graph also outputs the given tensors (FP32), for calibration. */
export function withExtraOutputs(model: ModelProto, names: string[]): ModelProto {
  const m = clone(ModelProtoSchema, model);
  const g = m.graph!;
  const have = new Set(g.output.map((o) => o.name!));
  for (const name of names) {
    if (have.has(name)) continue;
    const tensorType = create(TypeProto_TensorSchema, { elemType: TensorProto_DataType.FLOAT });
    g.output.push(
      create(ValueInfoProtoSchema, {
        name,
        type: create(TypeProtoSchema, { value: { case: "tensorType", value: tensorType } }),
      }),
    );
  }
  return m;
}

export interface QuantizeOptions {
  /** per activation tensor of the plan: the range to quantize to */
  ranges: Record<string, TensorRange>;
  activationType?: ActivationType;
  /** 7-bit weights ([-63, 63]): avoids the int16 saturation of AVX2's VPMADDUBSW on non-VNNI CPUs */
  reduceRange?: boolean;
  /**
   * Weight storage: int8 (zero point 0; ONNX Runtime's u8×s8 kernels) or uint8 (the same values
   * + 128, zero point 128; its u8×u8 kernels, which do not saturate on CPUs without VNNI, so the
   * weights keep all 8 bits, at some speed).
   */
  weightType?: "int8" | "uint8";
  /** extra metadata_props */
  metadata?: Record<string, string>;
}

export interface QuantizeResult {
  model: ModelProto;
  plan: QuantizationPlan;
  params: Record<string, QuantParams>;
  weights: number;
}

/**
 * The QDQ int8 model: each planned activation tensor `t` becomes QuantizeLinear(t) →
 * DequantizeLinear → `t_dequantized` (its readers rewired), each Conv/Gemm/MatMul weight an int8
 * initializer with per-output-channel scales (zero points 0) behind a DequantizeLinear with
 * `axis`, and a Conv/Gemm bias an int32 initializer at scale x_scale × w_scale (as ONNX Runtime
 * wants it to fuse DQ → Conv → Q into QLinearConv).
 */
export function quantizeModel(input: ModelProto, opts: QuantizeOptions): QuantizeResult {
  const model = clone(ModelProtoSchema, input);
  upgradeToOpset13(model);
  foldBatchNorms(model);
  const plan = planQuantization(model);
  const g = model.graph!;
  const type = opts.activationType ?? "uint8";
  const wqmax = opts.reduceRange ? 63 : 127;
  const inits = new Map(g.initializer.map((t) => [t.name!, t]));
  const params: Record<string, QuantParams> = {};
  for (const t of plan.tensors) {
    const r = opts.ranges[t];
    if (!r) throw new Error(`no calibrated range for ${t}`);
    params[t] = activationParams(r, type);
  }
  for (const n of g.node) {
    const [x, y] = [n.input[0]!, n.output[0]!];
    if (PASS_THROUGH.has(n.opType!) && params[x] && params[y]) params[y] = params[x];
  }
  const qname = (t: string) => `${t}_quantized`;
  const dqname = (t: string) => `${t}_dequantized`;
  const newInits: TensorProto[] = [];
  const qdqNodes = (t: string): NodeProto[] => {
    const p = params[t]!;
    newInits.push(
      floatTensor(`${t}_scale`, [], Float32Array.of(p.scale)),
      zeroPointTensor(`${t}_zero_point`, type, p.zeroPoint),
    );
    return [
      node("QuantizeLinear", `${t}_QuantizeLinear`, [t, `${t}_scale`, `${t}_zero_point`], [qname(t)]),
      node("DequantizeLinear", `${t}_DequantizeLinear`, [qname(t), `${t}_scale`, `${t}_zero_point`], [dqname(t)]),
    ];
  };
  const planned = new Set(plan.tensors);
  const quantizedNodes = new Set(plan.nodes);
  const weightDone = new Map<string, { name: string; scales: Float32Array }>();
  let weights = 0;

  /** int8 per-channel weight along `axis` → [DequantizeLinear] */
  const quantizeWeight = (wName: string, axis: number): { node?: NodeProto; name: string; scales: Float32Array } => {
    const done = weightDone.get(wName);
    if (done) return done;
    const w = inits.get(wName)!;
    const d = w.dims.map(Number);
    const v = tensorValues(w);
    const channels = d[axis]!;
    const inner = d.slice(axis + 1).reduce((a, b) => a * b, 1);
    const absMax = new Float64Array(channels);
    for (let i = 0; i < v.length; i++) {
      const c = Math.floor(i / inner) % channels;
      const a = Math.abs(v[i]!);
      if (a > absMax[c]!) absMax[c] = a;
    }
    const scales = Float32Array.from(absMax, (a) => weightScale(a, wqmax));
    const unsigned = opts.weightType === "uint8";
    const offset = unsigned ? 128 : 0;
    const q = unsigned ? new Uint8Array(v.length) : new Int8Array(v.length);
    for (let i = 0; i < v.length; i++) {
      const c = Math.floor(i / inner) % channels;
      q[i] = clamp(roundHalfEven(v[i]! / scales[c]!), -wqmax, wqmax) + offset;
    }
    const dataType = unsigned ? TensorProto_DataType.UINT8 : TensorProto_DataType.INT8;
    newInits.push(
      intTensor(`${wName}_quantized`, d, dataType, q),
      floatTensor(`${wName}_scale`, [channels], scales),
      intTensor(
        `${wName}_zero_point`,
        [channels],
        dataType,
        unsigned ? new Uint8Array(channels).fill(offset) : new Int8Array(channels),
      ),
    );
    weights += v.length;
    const dq = create(NodeProtoSchema, {
      ...node(
        "DequantizeLinear",
        `${wName}_DequantizeLinear`,
        [`${wName}_quantized`, `${wName}_scale`, `${wName}_zero_point`],
        [dqname(wName)],
        { axis },
      ),
    });
    const r = { node: dq, name: dqname(wName), scales };
    weightDone.set(wName, { name: r.name, scales });
    return r;
  };

  const out: NodeProto[] = [];
  for (const v of g.input) if (planned.has(v.name!)) out.push(...qdqNodes(v.name!));
  const removedInits = new Set<string>();
  for (const n0 of g.node) {
    const n = clone(NodeProtoSchema, n0);
    const id = n.name || n.output[0]!;
    n.input = n.input.map((x) => (planned.has(x) ? dqname(x) : x));
    if (quantizedNodes.has(id) && WEIGHTED.has(n.opType!)) {
      const wName = n0.input[1]!;
      // output channels: Conv weight [M, C/g, kh, kw] → 0; Gemm B [K, N] → 1 (transB=0) or 0; MatMul B [K, N] → 1
      const w = inits.get(wName)!;
      const axis =
        n.opType! === "Conv" ? 0 : n.opType! === "Gemm" ? (attrInt(n, "transB", 0) ? 0 : 1) : w.dims.length - 1;
      const wq = quantizeWeight(wName, axis);
      if (wq.node) out.push(wq.node);
      n.input[1] = wq.name;
      removedInits.add(wName);
      const bName = n0.input[2];
      const xParams = params[n0.input[0]!];
      if (bName && inits.has(bName) && xParams && (n.opType! === "Conv" || n.opType! === "Gemm")) {
        const b = tensorValues(inits.get(bName)!);
        const bs = new Float32Array(b.length);
        const bq = new Int32Array(b.length);
        for (let c = 0; c < b.length; c++) {
          bs[c] = Math.fround(xParams.scale * wq.scales[wq.scales.length === 1 ? 0 : c]!);
          bq[c] = clamp(roundHalfEven(b[c]! / bs[c]!), -2147483647, 2147483647);
        }
        newInits.push(
          intTensor(`${bName}_quantized`, [b.length], TensorProto_DataType.INT32, bq),
          floatTensor(`${bName}_scale`, [b.length], bs),
          intTensor(`${bName}_zero_point`, [b.length], TensorProto_DataType.INT32, new Int32Array(b.length)),
        );
        out.push(
          node(
            "DequantizeLinear",
            `${bName}_DequantizeLinear`,
            [`${bName}_quantized`, `${bName}_scale`, `${bName}_zero_point`],
            [dqname(bName)],
            { axis: 0 },
          ),
        );
        n.input[2] = dqname(bName);
        removedInits.add(bName);
      }
    }
    out.push(n);
    for (const y of n.output) if (planned.has(y)) out.push(...qdqNodes(y));
  }
  // a weight also read elsewhere (fp32) keeps its initializer
  const stillRead = new Set(out.flatMap((n) => n.input));
  g.initializer = [...g.initializer.filter((t) => !removedInits.has(t.name!) || stillRead.has(t.name!)), ...newInits];
  g.node = out;
  model.metadataProps = [
    ...model.metadataProps.filter((p) => !(p.key ?? "").startsWith("trellis.quantization")),
    ...Object.entries({
      "trellis.quantization": `QDQ ${type} activations, ${opts.weightType ?? "int8"} per-channel symmetric weights${opts.reduceRange ? " (7-bit)" : ""}`,
      ...opts.metadata,
    }).map(([key, value]) => create(StringStringEntryProtoSchema, { key, value })),
  ];
  return { model, plan, params, weights };
}

/** op type → count, for a model (e.g. ORT's optimized graph) */
export function countOps(model: ModelProto): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const n of model.graph?.node ?? []) {
    const k = n.domain ? `${n.domain}:${n.opType!}` : n.opType!;
    counts[k] = (counts[k] ?? 0) + 1;
  }
  return Object.fromEntries(Object.entries(counts).sort(([a], [b]) => (a < b ? -1 : 1)));
}
