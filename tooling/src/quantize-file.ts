/**
 * `models:quantize` without the command line: read an fp32 model, calibrate on photos, write the
 * QDQ int8 model, let ONNX Runtime show which nodes it fuses into int8 kernels, and compare fp32
 * with int8 on held-out photos.
 */
import { createHash } from "node:crypto";
import { mkdir, readFile, rename, rm, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import {
  type AccuracyReport,
  type CalibrationMethod,
  calibrate,
  channelMaxima,
  compareModels,
  listImages,
  type Progress,
  preprocessImages,
  writeOptimizedGraph,
} from "./calibrate.js";
import { ModelProtoSchema } from "./gen/onnx_pb.js";
import {
  type ActivationType,
  countOps,
  depthwiseInputs,
  equalizeDepthwiseInputs,
  foldBatchNorms,
  planQuantization,
  type QuantParams,
  quantizeModel,
  type TensorRange,
} from "./quantize.js";

export interface QuantizeFileOptions {
  model: string;
  /** a folder of photos or a file listing them */
  calibration: string;
  /** held-out photos for the accuracy report */
  evaluation?: string;
  out: string;
  method?: CalibrationMethod;
  percentile?: number;
  activationType?: ActivationType;
  reduceRange?: boolean;
  /** weight storage, see QuantizeOptions.weightType */
  weightType?: "int8" | "uint8";
  /** depthwise-input equalization before calibration, with this headroom (see equalizeDepthwiseInputs) */
  equalize?: { headroom: number };
  /** where ORT's optimized graph goes (default: <out>.ort-optimized.onnx, deleted after counting) */
  optimizedPath?: string;
  progress?: Progress;
}

export interface LayerRange {
  tensor: string;
  observed: TensorRange;
  quantized: TensorRange;
  scale: number;
  zeroPoint: number;
}

export interface QuantizeReport {
  model: string;
  out: string;
  sha256: string;
  bytes: number;
  method: CalibrationMethod;
  percentile?: number;
  activationType: ActivationType;
  reduceRange: boolean;
  weightType: "int8" | "uint8";
  /** depthwise-input tensors rescaled by equalization, and its headroom */
  equalized?: { tensors: number; headroom: number };
  calibrationImages: string[];
  /** images the seed preprocessing refused (calibration and held-out), left out */
  skippedImages: { file: string; error: string }[];
  quantizedWeights: number;
  qdqTensors: number;
  /** op counts of the QDQ model and of the graph ONNX Runtime runs after fusing it */
  qdqOps: Record<string, number>;
  ortOptimizedOps: Record<string, number>;
  layers: LayerRange[];
  accuracy?: AccuracyReport;
}

export async function quantizeFile(o: QuantizeFileOptions): Promise<QuantizeReport> {
  const method = o.method ?? "percentile";
  const activationType = o.activationType ?? "uint8";
  const src = new Uint8Array(await readFile(o.model));
  const fp32 = fromBinary(ModelProtoSchema, src);
  // plan and calibrate on the graph the quantizer sees: BatchNormalization folded into its Conv
  foldBatchNorms(fp32);
  const listed = await listImages(o.calibration);
  const pre = await preprocessImages(listed, (d, t, f) => o.progress?.(d, t, `preprocess ${basename(f)}`));
  const calibrationImages = pre.files;
  const inputs = pre.tensors;
  if (inputs.length === 0) throw new Error(`no usable images in ${o.calibration}`);
  const skipped = [...pre.skipped];
  let equalized: QuantizeReport["equalized"];
  if (o.equalize) {
    const maxima = await channelMaxima(
      fp32,
      depthwiseInputs(fp32).map((d) => d.tensor),
      inputs,
      (d, t, w) => o.progress?.(d, t, `equalize (${w})`),
    );
    equalized = { tensors: equalizeDepthwiseInputs(fp32, maxima, o.equalize), headroom: o.equalize.headroom };
  }
  const plan = planQuantization(fp32);
  const cal = await calibrate(fp32, plan.tensors, inputs, {
    method,
    percentile: o.percentile,
    progress: (d, t, w) => o.progress?.(d, t, `calibrate (${w})`),
  });
  const percentile = method === "percentile" ? (o.percentile ?? 99.99) : undefined;
  const q = quantizeModel(fp32, {
    ranges: cal.ranges,
    activationType,
    reduceRange: o.reduceRange,
    weightType: o.weightType,
    metadata: {
      "trellis.quantization.calibration": `${method}${percentile !== undefined ? ` ${percentile}` : ""}, ${calibrationImages.length} images${equalized ? `, ${equalized.tensors} depthwise inputs equalized (headroom ${equalized.headroom})` : ""}`,
    },
  });
  const bytes = toBinary(ModelProtoSchema, q.model);
  await mkdir(dirname(o.out), { recursive: true });
  const part = `${o.out}.part`;
  await writeFile(part, bytes);
  await rename(part, o.out);

  const optimized = o.optimizedPath ?? `${o.out}.ort-optimized.onnx`;
  await writeOptimizedGraph(bytes, optimized);
  const ortOptimizedOps = countOps(fromBinary(ModelProtoSchema, new Uint8Array(await readFile(optimized))));
  if (!o.optimizedPath) await rm(optimized, { force: true });

  const layers: LayerRange[] = plan.tensors.map((t) => {
    const p: QuantParams = q.params[t]!;
    const [qmin, qmax] = activationType === "uint8" ? [0, 255] : [-128, 127];
    return {
      tensor: t,
      observed: cal.observed[t]!,
      quantized: { min: (qmin - p.zeroPoint) * p.scale, max: (qmax - p.zeroPoint) * p.scale },
      scale: p.scale,
      zeroPoint: p.zeroPoint,
    };
  });
  const report: QuantizeReport = {
    model: o.model,
    out: o.out,
    sha256: createHash("sha256").update(bytes).digest("hex"),
    bytes: bytes.length,
    method,
    ...(percentile !== undefined ? { percentile } : {}),
    activationType,
    reduceRange: o.reduceRange ?? false,
    weightType: o.weightType ?? "int8",
    ...(equalized ? { equalized } : {}),
    calibrationImages,
    skippedImages: skipped,
    quantizedWeights: q.weights,
    qdqTensors: plan.tensors.length,
    qdqOps: countOps(q.model),
    ortOptimizedOps,
    layers,
  };
  if (o.evaluation) {
    const held = await preprocessImages(await listImages(o.evaluation), (d, t, f) =>
      o.progress?.(d, t, `preprocess ${basename(f)}`),
    );
    report.skippedImages.push(...held.skipped);
    report.accuracy = await compareModels(src, bytes, held.tensors, held.files, (d, t) =>
      o.progress?.(d, t, "compare fp32 vs int8"),
    );
  }
  return report;
}

/** `<repo>/<model>/<version>/model.onnx` → the same file name in version `n`. */
export function versionPath(model: string, n: number): string {
  const versionDir = dirname(model);
  if (!/^\d+$/.test(basename(versionDir)))
    throw new Error(`--version: ${model} is not inside a numbered version folder`);
  return join(dirname(versionDir), String(n), basename(model));
}
