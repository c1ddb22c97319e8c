export { type EnsureModelsOptions, type EnsureModelsResult, ensureModels } from "./ensure.js";
export {
  type Artifact,
  ChecksumError,
  DownloadError,
  defaultArtifacts,
  type FetchedArtifact,
  type FetchModelsOptions,
  fetchModels,
  IMAGENET_LABELS_SHA256,
  IMAGENET_LABELS_URL,
  OfflineError,
  RESNET50_ZOO_INPUT,
  RESNET50_ZOO_OUTPUT,
  RESNET50_ZOO_SHA256,
  RESNET50_ZOO_URL,
  renameGraphTensors,
  SOURCE_SHA256_KEY,
} from "./fetch.js";
export { isSyntheticModel, type OnnxFileMetadata, readOnnxMetadata, SYNTHETIC_METADATA_KEY } from "./onnx.js";
export {
  BUNDLED_DIR,
  BUNDLED_LABELS_FILE,
  BUNDLED_MODEL_BYTES,
  BUNDLED_MODEL_FILE,
  BUNDLED_MODEL_SHA256,
  BUNDLED_NOTICE,
  DEFAULT_REPOSITORY,
  hasSeedArtifacts,
  INFERENCE_CONFIG,
  INFERENCE_MODEL,
  isBundledModel,
  isSeedRepository,
  LABELS_FILE,
} from "./paths.js";
export {
  buildResNet50,
  countParameters,
  RESNET50_PARAMETERS,
  type SynthesizeOptions,
  type SynthesizeResult,
  synthesizeResNet50,
  writeSyntheticLabels,
} from "./synth.js";

import type { DequantizeReport } from "./dequantize-file.js";
import type { QuantizeFileOptions, QuantizeReport } from "./quantize-file.js";

export type { DequantizeReport, QuantizeFileOptions, QuantizeReport };

/** `models:dequantize` without the command line: writes to `out` the fp32 model of a QOperator int8 `model`. */
export async function dequantizeFile(model: string, out: string): Promise<DequantizeReport> {
  return (await import("./dequantize-file.js")).dequantizeFile(model, out);
}
/**
 * `models:quantize` without the command line: calibrate, write the QDQ int8 model to `out`,
 * return the report (not written). ONNX Runtime and the preprocess stage load on the first call,
 * so importing this package for `ensureModels` stays light.
 */
export async function quantizeFile(options: QuantizeFileOptions): Promise<QuantizeReport> {
  return (await import("./quantize-file.js")).quantizeFile(options);
}
