/**
 * Where the seed's artifacts live, and the bundled offline model. Kept free of heavy imports: the
 * server reads these on every start through `@trellis/tooling/paths` without loading the rest.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { stat } from "node:fs/promises";
import { join } from "node:path";
import { pipeline } from "node:stream/promises";
import { fileURLToPath } from "node:url";

/**
 * The project's default model repository (`<root>/models`), from this file's place in tooling/: the
 * one folder `--fetch-models` writes into. `TRELLIS_PROJECT_MODELS` names another (a test's fresh
 * copy of it); a repository a user gives the server is never written to.
 */
export const DEFAULT_REPOSITORY =
  process.env.TRELLIS_PROJECT_MODELS || fileURLToPath(new URL("../../models", import.meta.url));

/** The seed's inference model config; a repository without it is not the seed's. */
export const INFERENCE_CONFIG = "resnet50_inference/config.pbtxt";
/** The seed's ResNet-50 weights, relative to a model repository. */
export const INFERENCE_MODEL = "resnet50_inference/1/model.onnx";
/** The seed postprocess model's label file, relative to a model repository. */
export const LABELS_FILE = "resnet50_postprocess/1/imagenet_classes.txt";

/** tooling/bundled: the real classifier served when ResNet-50 cannot be downloaded (not in the npm package). */
export const BUNDLED_DIR = fileURLToPath(new URL("../bundled", import.meta.url));
/** The ONNX Model Zoo's MobileNetV2-12 int8 (Apache-2.0): input `input` [N,3,224,224], output `output` [N,1000]. */
export const BUNDLED_MODEL_FILE = "mobilenetv2-12-int8.onnx";
/** Its 1000 ImageNet class names, one a line, in the model's output order. */
export const BUNDLED_LABELS_FILE = "imagenet-1k-labels.txt";
export const BUNDLED_MODEL_SHA256 = "83530ad811bc31d2b60a5599a21265a5057608c9b044b4ee758cc22f2309f54f";
export const BUNDLED_MODEL_BYTES = 3_655_640;
/** The line the server logs, naming the model, whenever it serves the bundled network. */
export const BUNDLED_NOTICE = "bundled MobileNetV2 (offline); pnpm models:fetch gets ResNet-50";

/** Whether anything is at `path` (a model.onnx may also be a directory holding one). */
export const exists = async (path: string) => (await stat(path).catch(() => undefined)) !== undefined;

/** Whether `repository` is laid out as the seed's (it has the seed's inference config). */
export const isSeedRepository = (repository: string) => exists(join(repository, INFERENCE_CONFIG));

/** Whether the seed's weights and labels are in `repository` (they are not committed). */
export async function hasSeedArtifacts(repository: string): Promise<boolean> {
  return (await exists(join(repository, INFERENCE_MODEL))) && (await exists(join(repository, LABELS_FILE)));
}

/** The SHA-256 of a file's bytes, hex. */
export async function sha256File(path: string): Promise<string> {
  const hash = createHash("sha256");
  await pipeline(createReadStream(path), hash);
  return hash.digest("hex");
}

/**
 * Whether the file at `path` is the bundled MobileNetV2, byte for byte: its size first (one stat,
 * so any other model costs nothing more), then its SHA-256.
 */
export async function isBundledModel(path: string): Promise<boolean> {
  const info = await stat(path).catch(() => undefined);
  if (!info?.isFile() || info.size !== BUNDLED_MODEL_BYTES) return false;
  return (await sha256File(path)) === BUNDLED_MODEL_SHA256;
}
