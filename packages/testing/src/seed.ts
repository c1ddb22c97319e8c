/** Temp model repositories built from the seed's configs and the bundled model and labels. */
import { existsSync } from "node:fs";
import { copyFile, mkdir, mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LABELS_PATH, MOBILENET_PATH, modelsDir, sharedDir } from "./paths.js";

export interface SeedRepositoryOptions {
  /** Temp folder name prefix (default "trellis-seed-"). */
  prefix?: string;
  /** Rewrites a model's config.pbtxt text on the way (e.g. another queue delay, preprocess mode). */
  editConfig?: (model: string, config: string) => string;
  /**
   * The seed deployment's own Python models (shared/fixtures/triton-python: preprocess.py,
   * postprocess.py, their configs with `backend: "python"`) in place of the TypeScript ones, each
   * config's instance_group count lowered to this (32 processes per model is for a big machine).
   */
  pythonInstances?: number;
}

/**
 * The seed deployment's Python models, as a Triton user's repository holds them. They are not
 * ours to commit, so they are read from ../shared, which only this project's own machines have.
 */
const PYTHON_MODELS = join(sharedDir, "fixtures", "triton-python");

/**
 * Why the tests that serve the seed's own model.py files cannot run here, in one line, or
 * undefined when they can. In CI (CI=true) the material must be there: its absence is an error.
 */
export function seedPythonModelsMissing(): string | undefined {
  if (existsSync(join(PYTHON_MODELS, "resnet50_preprocess", "1", "preprocess.py"))) return undefined;
  const why = "the seed deployment's own model.py files (../shared/fixtures/triton-python) are not beside this clone";
  if (process.env.CI === "true") throw new Error(`${why}, and CI must run the tests that serve them`);
  return why;
}
const PYTHON_FILES = [
  ["resnet50_preprocess", "preprocess.py"],
  ["resnet50_postprocess", "postprocess.py"],
] as const;

/** The seed's models: the `resnet50_*` folders of models/ (models/gpu and the like are not seed models). */
export async function seedModelNames(): Promise<string[]> {
  return (await readdir(modelsDir)).filter((n) => n.startsWith("resnet50_")).sort();
}

/**
 * A temp copy of the seed repository (models/resnet50_*\/config.pbtxt, version 1)
 * with the bundled MobileNetV2 as resnet50_inference/1/model.onnx and the
 * ImageNet labels in resnet50_postprocess/1/. Returns its path; remove it with `removeDir`.
 */
export async function makeSeedRepository(options: SeedRepositoryOptions = {}): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), options.prefix ?? "trellis-seed-"));
  for (const name of await seedModelNames()) {
    await mkdir(join(dir, name, "1"), { recursive: true });
    const config = await readFile(join(modelsDir, name, "config.pbtxt"), "utf8");
    await writeFile(join(dir, name, "config.pbtxt"), options.editConfig ? options.editConfig(name, config) : config);
  }
  // A copy, not a link: loaders and child processes see an ordinary file.
  await copyFile(MOBILENET_PATH, join(dir, "resnet50_inference", "1", "model.onnx"));
  await copyFile(LABELS_PATH, join(dir, "resnet50_postprocess", "1", "imagenet_classes.txt"));
  if (options.pythonInstances !== undefined) {
    const missing = seedPythonModelsMissing();
    if (missing) throw new Error(`makeSeedRepository({ pythonInstances }): ${missing}`);
    for (const [model, file] of PYTHON_FILES) {
      const config = await readFile(join(PYTHON_MODELS, model, "config.pbtxt"), "utf8");
      await writeFile(
        join(dir, model, "config.pbtxt"),
        config.replace(/count: 32/, `count: ${options.pythonInstances}`),
      );
      await copyFile(join(PYTHON_MODELS, model, "1", file), join(dir, model, "1", file));
    }
  }
  return dir;
}

export const removeDir = (dir: string): Promise<void> => rm(dir, { recursive: true, force: true });
