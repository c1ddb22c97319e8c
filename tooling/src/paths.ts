/**
 * Where the seed's artifacts live. Kept free of heavy imports: the server reads
 * these on every start through `@trellis/tooling/paths` without loading the rest.
 */
import { stat } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** The project's default model repository (`<root>/models`), from this file's place in tooling/. */
export const DEFAULT_REPOSITORY = fileURLToPath(new URL("../../models", import.meta.url));

/** The seed's inference model config; a repository without it is not the seed's. */
export const INFERENCE_CONFIG = "resnet50_inference/config.pbtxt";
/** The seed's ResNet-50 weights, relative to a model repository. */
export const INFERENCE_MODEL = "resnet50_inference/1/model.onnx";
/** The seed postprocess model's label file, relative to a model repository. */
export const LABELS_FILE = "resnet50_postprocess/1/imagenet_classes.txt";

/** Whether anything is at `path` (a model.onnx may also be a directory holding one). */
export const exists = async (path: string) => (await stat(path).catch(() => undefined)) !== undefined;

/** Whether `repository` is laid out as the seed's (it has the seed's inference config). */
export const isSeedRepository = (repository: string) => exists(join(repository, INFERENCE_CONFIG));

/** Whether the seed's weights and labels are in `repository` (they are not committed). */
export async function hasSeedArtifacts(repository: string): Promise<boolean> {
  return (await exists(join(repository, INFERENCE_MODEL))) && (await exists(join(repository, LABELS_FILE)));
}
