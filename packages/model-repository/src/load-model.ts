/**
 * loadModel: one model of a Triton-layout repository as a ready Stage, in one call, for a
 * program of one's own: what the server would serve under that name (an ensemble with its steps,
 * an ONNX model, a TypeScript stage), each model served by its runtime.
 */
import { Code, type Stage, StageError } from "@trellis/stage";
import { type LoadStageOptions, loadStage } from "./loader.js";
import { selectVersions } from "./registry.js";
import { scanRepository } from "./scan.js";

export interface LoadModelOptions extends Partial<Omit<LoadStageOptions, "repositories">> {
  /** The version folder to load; default: the newest its version_policy serves. */
  version?: string;
}

/**
 * Model `name` of `repository` (a folder, or several searched in order), loaded as the server
 * loads it: the ensemble's steps from the same repositories, config.pbtxt checked against each
 * model. Close it when done; an ensemble closes the steps it loaded.
 */
export async function loadModel(
  repository: string | readonly string[],
  name: string,
  options: LoadModelOptions = {},
): Promise<Stage> {
  const repositories = typeof repository === "string" ? [repository] : [...repository];
  const { models, errors } = await scanRepository(repositories);
  const model = models.find((m) => m.name === name);
  if (!model) {
    const broken = errors.find((e) => e.name === name);
    if (broken) throw new StageError(Code.InvalidArgument, name, broken.error.message, { cause: broken.error });
    const known = models.map((m) => m.name).join(", ");
    throw new StageError(Code.NotFound, name, `no model "${name}" in the repository (models: ${known || "none"})`);
  }
  const version = options.version ?? selectVersions(model.config, model.versions).at(-1);
  if (!version) throw new StageError(Code.NotFound, name, `model "${name}" has no version folder to serve`);
  return loadStage(model, { ...options, version, repositories });
}
