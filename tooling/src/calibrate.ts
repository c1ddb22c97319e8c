/**
 * Calibration and the accuracy report for `models:quantize`: photos through the project's own
 * preprocessing stage (@trellis/preprocess, seed mode), the fp32 model run with its activation
 * tensors as extra outputs (ONNX Runtime), ranges by min-max or percentile, then fp32 vs int8 on
 * held-out photos.
 */
import { readdir, readFile, stat } from "node:fs/promises";
import { extname, join, resolve } from "node:path";
import { toBinary } from "@bufbuild/protobuf";
import { createPreprocess } from "@trellis/preprocess";
import * as ort from "onnxruntime-node";
import { type ModelProto, ModelProtoSchema } from "./gen/onnx_pb.js";
import { type TensorRange, withExtraOutputs } from "./quantize.js";

const IMAGE_EXT = new Set([".jpg", ".jpeg", ".png", ".webp", ".tif", ".tiff", ".bmp", ".ppm", ".pgm"]);

/** Image files: a folder's (sorted by name, not recursive) or those a text file lists one a line. */
export async function listImages(source: string): Promise<string[]> {
  const s = await stat(source);
  if (s.isDirectory()) {
    const names = (await readdir(source)).filter((n) => IMAGE_EXT.has(extname(n).toLowerCase())).sort();
    return names.map((n) => join(source, n));
  }
  const text = await readFile(source, "utf8");
  return text
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith("#"))
    .map((l) => resolve(l));
}

export type Progress = (done: number, total: number, what: string) => void;

export interface PreprocessedImages {
  /** [1,3,224,224] FP32 tensors of the images that decoded, in order */
  tensors: Float32Array[];
  files: string[];
  /** images the seed preprocessing refused (undecodable, unsupported format), with its message */
  skipped: { file: string; error: string }[];
}

/** The tensors the seed's preprocessing makes (createPreprocess seed mode); an image it refuses is skipped. */
export async function preprocessImages(files: string[], progress?: Progress): Promise<PreprocessedImages> {
  const stage = createPreprocess({ mode: "seed" });
  const out: PreprocessedImages = { tensors: [], files: [], skipped: [] };
  try {
    for (const [k, f] of files.entries()) {
      const bytes = new Uint8Array(await readFile(f));
      try {
        const res = await stage.infer({
          inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [1, 1], data: [bytes] }],
        });
        out.tensors.push(Float32Array.from(res.outputs[0]!.data as Float32Array));
        out.files.push(f);
      } catch (err) {
        out.skipped.push({ file: f, error: (err as Error).message });
      }
      progress?.(k + 1, files.length, f);
    }
  } finally {
    await stage.close?.();
  }
  return out;
}

export type CalibrationMethod = "minmax" | "percentile" | "mse";

export interface CalibrationResult {
  /** the range each tensor is quantized to */
  ranges: Record<string, TensorRange>;
  /** the min and max observed over all calibration images */
  observed: Record<string, TensorRange>;
}

const BINS = 2048;

function sessionOptions(): ort.InferenceSession.SessionOptions {
  // one thread: deterministic and gentle on a shared machine
  return { intraOpNumThreads: 1, interOpNumThreads: 1, executionMode: "sequential" };
}

/**
 * Ranges of `tensors` over the calibration inputs. minmax: the observed min and max.
 * percentile: per tensor a 2048-bin histogram over the observed range (a second pass), and the
 * range cut at the `percentile`-th and (100 − percentile)-th percentiles of the values, so a few
 * outliers do not stretch the scale.
 */
export async function calibrate(
  model: ModelProto,
  tensors: string[],
  inputs: Float32Array[],
  opts: { method: CalibrationMethod; percentile?: number; levels?: number; inputName?: string; progress?: Progress },
): Promise<CalibrationResult> {
  const bytes = toBinary(ModelProtoSchema, withExtraOutputs(model, tensors));
  const session = await ort.InferenceSession.create(bytes, sessionOptions());
  const inputName = opts.inputName ?? session.inputNames[0]!;
  const observed: Record<string, TensorRange> = {};
  for (const t of tensors) observed[t] = { min: Number.POSITIVE_INFINITY, max: Number.NEGATIVE_INFINITY };
  const total = opts.method === "percentile" ? inputs.length * 2 : inputs.length;
  let done = 0;
  const run = async (x: Float32Array) =>
    session.run({ [inputName]: new ort.Tensor("float32", x, [1, 3, 224, 224]) }, tensors);
  try {
    for (const x of inputs) {
      const res = await run(x);
      for (const t of tensors) {
        const d = res[t]!.data as Float32Array;
        const o = observed[t]!;
        for (let i = 0; i < d.length; i++) {
          const v = d[i]!;
          if (v < o.min) o.min = v;
          if (v > o.max) o.max = v;
        }
      }
      opts.progress?.(++done, total, "ranges");
    }
    if (opts.method === "minmax") return { ranges: structuredClone(observed), observed };
    const pct = opts.percentile ?? 99.99;
    const hist: Record<string, Float64Array> = {};
    for (const t of tensors) hist[t] = new Float64Array(BINS);
    for (const x of inputs) {
      const res = await run(x);
      for (const t of tensors) {
        const d = res[t]!.data as Float32Array;
        const { min, max } = observed[t]!;
        const h = hist[t]!;
        const w = max > min ? (BINS - 1) / (max - min) : 0;
        for (let i = 0; i < d.length; i++) h[Math.floor((d[i]! - min) * w)]!++;
      }
      opts.progress?.(++done, total, "histograms");
    }
    const ranges: Record<string, TensorRange> = {};
    for (const t of tensors) {
      const { min, max } = observed[t]!;
      ranges[t] =
        opts.method === "mse"
          ? mseRange(hist[t]!, min, max, opts.levels ?? 255)
          : percentileRange(hist[t]!, min, max, pct);
    }
    return { ranges, observed };
  } finally {
    await session.release();
  }
}

/** Per tensor (NCHW), each channel's largest |value| over the calibration inputs. */
export async function channelMaxima(
  model: ModelProto,
  tensors: string[],
  inputs: Float32Array[],
  progress?: Progress,
): Promise<Record<string, Float64Array>> {
  const session = await ort.InferenceSession.create(
    toBinary(ModelProtoSchema, withExtraOutputs(model, tensors)),
    sessionOptions(),
  );
  const maxima: Record<string, Float64Array> = {};
  try {
    for (const [k, x] of inputs.entries()) {
      const res = await session.run(
        { [session.inputNames[0]!]: new ort.Tensor("float32", x, [1, 3, 224, 224]) },
        tensors,
      );
      for (const t of tensors) {
        const { data, dims } = res[t]!;
        const d = data as Float32Array;
        const channels = Number(dims[1]);
        const plane = d.length / channels;
        maxima[t] ??= new Float64Array(channels);
        const m = maxima[t];
        for (let c = 0; c < channels; c++)
          for (let i = c * plane; i < (c + 1) * plane; i++) {
            const v = Math.abs(d[i]!);
            if (v > m[c]!) m[c] = v;
          }
      }
      progress?.(k + 1, inputs.length, "channels");
    }
  } finally {
    await session.release();
  }
  return maxima;
}

/** The range cut at the (100 − pct)-th and pct-th percentiles of a histogram over [min, max]. */
export function percentileRange(h: Float64Array, min: number, max: number, pct: number): TensorRange {
  const bins = h.length;
  const n = h.reduce((a, b) => a + b, 0);
  const cut = (n * (100 - pct)) / 100;
  let lo = 0;
  for (let acc = 0; lo < bins - 1 && acc + h[lo]! <= cut; lo++) acc += h[lo]!;
  let hi = bins - 1;
  for (let acc = 0; hi > 0 && acc + h[hi]! <= cut; hi--) acc += h[hi]!;
  const width = (max - min) / (bins - 1);
  return { min: lo === 0 ? min : min + lo * width, max: hi === bins - 1 ? max : Math.min(max, min + (hi + 1) * width) };
}

/**
 * The range with the least expected squared error over a histogram: values outside it are
 * clipped (error = distance²), values inside are rounded (error = scale² / 12), scale =
 * (hi − lo) / levels. Both ends are searched on a grid of 1/64 steps of the observed range.
 */
export function mseRange(h: Float64Array, min: number, max: number, levels: number): TensorRange {
  const bins = h.length;
  const width = (max - min) / (bins - 1);
  const lo0 = Math.min(min, 0);
  const hi0 = Math.max(max, 0);
  let best = { min: lo0, max: hi0 };
  let bestErr = Number.POSITIVE_INFINITY;
  const steps = 64;
  for (let i = 0; i < steps; i++) {
    const lo = lo0 * (1 - i / steps);
    for (let j = 0; j < steps; j++) {
      const hi = hi0 * (1 - j / steps);
      if (!(hi > lo)) continue;
      const s2 = ((hi - lo) / levels) ** 2 / 12;
      let err = 0;
      for (let b = 0; b < bins; b++) {
        const c = h[b]!;
        if (c === 0) continue;
        const v = min + b * width;
        err += c * (v < lo ? (lo - v) ** 2 : v > hi ? (v - hi) ** 2 : s2);
      }
      if (err < bestErr) {
        bestErr = err;
        best = { min: lo, max: hi };
      }
      if (hi0 === 0) break;
    }
    if (lo0 === 0) break;
  }
  return best;
}

function softmax(logits: Float32Array): Float64Array {
  let m = Number.NEGATIVE_INFINITY;
  for (const v of logits) if (v > m) m = v;
  const e = Float64Array.from(logits, (v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
}

function argMax(a: Float32Array): number {
  let k = 0;
  for (let i = 1; i < a.length; i++) if (a[i]! > a[k]!) k = i;
  return k;
}

function topK(p: Float64Array, k: number): number[] {
  return [...p.keys()].sort((a, b) => p[b]! - p[a]! || a - b).slice(0, k);
}

export interface ImageComparison {
  file: string;
  fp32Top1: number;
  /** the fp32 network's probability for its top-1 class */
  fp32Top1Prob: number;
  /** the fp32 network's lead: its top-1 probability minus its second's */
  fp32Margin: number;
  int8Top1: number;
  agree: boolean;
  /** the int8 top-1 with ONNX Runtime's graph optimizations off: each QDQ pair computed exactly in
   * fp32, i.e. the int8 model without this CPU's integer kernels (their saturation, rounding) */
  exactInt8Top1: number;
  top5Overlap: number;
  maxAbsDeltaProb: number;
  logitCorrelation: number;
}

/** The fp32 lead (top-1 − top-2 probability) from which a photo counts as decisive. */
export const DECISIVE_MARGIN = 0.1;

export interface AccuracyReport {
  images: number;
  top1Agreement: number;
  /** top-1 agreement of the exactly computed int8 model (see ImageComparison.exactInt8Top1) */
  exactTop1Agreement: number;
  /** photos where the fp32 network leads by at least DECISIVE_MARGIN: a near-tie flips on any noise */
  decisive: { margin: number; images: number; top1Agreement: number; exactTop1Agreement: number };
  meanTop5Overlap: number;
  maxAbsDeltaProb: number;
  meanLogitCorrelation: number;
  disagreements: string[];
  perImage: ImageComparison[];
}

function correlation(a: Float32Array, b: Float32Array): number {
  const n = a.length;
  let ma = 0;
  let mb = 0;
  for (let i = 0; i < n; i++) {
    ma += a[i]!;
    mb += b[i]!;
  }
  ma /= n;
  mb /= n;
  let sab = 0;
  let saa = 0;
  let sbb = 0;
  for (let i = 0; i < n; i++) {
    const x = a[i]! - ma;
    const y = b[i]! - mb;
    sab += x * y;
    saa += x * x;
    sbb += y * y;
  }
  return sab / Math.sqrt(saa * sbb);
}

/** fp32 vs int8 on held-out inputs: top-1 agreement, top-5 overlap, max |Δ probability|, logit correlation. */
export async function compareModels(
  fp32: Uint8Array | string,
  int8: Uint8Array | string,
  inputs: Float32Array[],
  files: string[],
  progress?: Progress,
): Promise<AccuracyReport> {
  const a = await ort.InferenceSession.create(fp32 as Uint8Array, sessionOptions());
  const b = await ort.InferenceSession.create(int8 as Uint8Array, sessionOptions());
  const exact = await ort.InferenceSession.create(int8 as Uint8Array, {
    ...sessionOptions(),
    graphOptimizationLevel: "disabled",
  });
  const perImage: ImageComparison[] = [];
  try {
    for (const [k, x] of inputs.entries()) {
      const feed = (s: ort.InferenceSession) => ({
        [s.inputNames[0]!]: new ort.Tensor("float32", x, [1, 3, 224, 224]),
      });
      const la = (await a.run(feed(a)))[a.outputNames[0]!]!.data as Float32Array;
      const lb = (await b.run(feed(b)))[b.outputNames[0]!]!.data as Float32Array;
      const le = (await exact.run(feed(exact)))[exact.outputNames[0]!]!.data as Float32Array;
      const pa = softmax(la);
      const pb = softmax(lb);
      const ta = topK(pa, 5);
      const tb = topK(pb, 5);
      let d = 0;
      for (let i = 0; i < pa.length; i++) d = Math.max(d, Math.abs(pa[i]! - pb[i]!));
      perImage.push({
        file: files[k]!,
        fp32Top1: ta[0]!,
        fp32Top1Prob: pa[ta[0]!]!,
        fp32Margin: pa[ta[0]!]! - pa[ta[1]!]!,
        int8Top1: tb[0]!,
        agree: ta[0] === tb[0],
        exactInt8Top1: argMax(le),
        top5Overlap: ta.filter((c) => tb.includes(c)).length / 5,
        maxAbsDeltaProb: d,
        logitCorrelation: correlation(la, lb),
      });
      progress?.(k + 1, inputs.length, files[k]!);
    }
  } finally {
    await a.release();
    await b.release();
    await exact.release();
  }
  const n = perImage.length;
  const share = (rows: ImageComparison[], ok: (r: ImageComparison) => boolean) =>
    rows.length ? rows.filter(ok).length / rows.length : Number.NaN;
  const exactAgrees = (r: ImageComparison) => r.exactInt8Top1 === r.fp32Top1;
  const decisive = perImage.filter((r) => r.fp32Margin >= DECISIVE_MARGIN);
  return {
    images: n,
    top1Agreement: share(perImage, (r) => r.agree),
    exactTop1Agreement: share(perImage, exactAgrees),
    decisive: {
      margin: DECISIVE_MARGIN,
      images: decisive.length,
      top1Agreement: share(decisive, (r) => r.agree),
      exactTop1Agreement: share(decisive, exactAgrees),
    },
    meanTop5Overlap: perImage.reduce((s, r) => s + r.top5Overlap, 0) / n,
    maxAbsDeltaProb: Math.max(...perImage.map((r) => r.maxAbsDeltaProb)),
    meanLogitCorrelation: perImage.reduce((s, r) => s + r.logitCorrelation, 0) / n,
    disagreements: perImage.filter((r) => !r.agree).map((r) => r.file),
    perImage,
  };
}

/**
 * Lets ONNX Runtime optimize the model (all graph optimizations, CPU) and write the graph it
 * runs to `path` (session option optimizedModelFilePath); returns nothing: decode `path` to see
 * which QDQ groups became QLinearConv & co.
 */
export async function writeOptimizedGraph(model: Uint8Array | string, path: string): Promise<void> {
  const s = await ort.InferenceSession.create(model as Uint8Array, {
    ...sessionOptions(),
    graphOptimizationLevel: "all",
    optimizedModelFilePath: path,
  });
  await s.release();
}
