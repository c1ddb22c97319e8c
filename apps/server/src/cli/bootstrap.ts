/**
 * First start of a fresh clone (--fetch-models, which `pnpm start` passes): the project's own
 * `models/` ships configs but no weights. If resnet50_inference has no model file (or
 * postprocess no labels), fetch them; offline, tooling installs the bundled MobileNetV2 (a real
 * ImageNet classifier with the same tensor names and shapes) and its labels, and on every start
 * a repository serving it says so in one line. Only the project's own `models/` is ever written:
 * a repository given from elsewhere (a Triton user's, a mounted volume) is served as it is, and
 * a model missing its weights there fails to load naming the file.
 */
import { readFile, realpath } from "node:fs/promises";
import { join } from "node:path";
import {
  BUNDLED_NOTICE,
  DEFAULT_REPOSITORY,
  hasSeedArtifacts,
  INFERENCE_CONFIG,
  INFERENCE_MODEL,
  isBundledModel,
  isSeedRepository,
} from "@trellis/tooling/paths";
import type { Logger } from "../server.js";

const real = (path: string) => realpath(path).catch(() => path);

/** The file the seed's inference model loads (its config's default_model_filename), relative to the repository. */
async function configuredModelFile(repository: string): Promise<string> {
  const config = await readFile(join(repository, INFERENCE_CONFIG), "utf8").catch(() => "");
  const named = /^\s*default_model_filename\s*:\s*"([^"]*)"/m.exec(config)?.[1];
  return named ? join(INFERENCE_MODEL, "..", named) : INFERENCE_MODEL;
}

export async function ensureSeedModels(repositories: string[], logger: Logger): Promise<void> {
  const own = await real(DEFAULT_REPOSITORY);
  for (const repository of repositories) {
    if (!(await isSeedRepository(repository)) || (await hasSeedArtifacts(repository))) continue;
    if ((await real(repository)) !== own) {
      logger.info(
        { repository },
        "--fetch-models: this repository is not the project's own models/ folder, so nothing is written to it",
      );
      continue;
    }
    const modelFile = await configuredModelFile(repository);
    if (modelFile !== INFERENCE_MODEL) {
      logger.warn(
        { repository, expected: modelFile },
        "--fetch-models: resnet50_inference's default_model_filename is not model.onnx, the file models:fetch writes: nothing fetched",
      );
      continue;
    }
    logger.info({ repository }, "ResNet-50 weights or labels missing; fetching them (pnpm models:fetch)");
    // Loaded only now: a normal start never pays for the rest of the tooling.
    const { ensureModels } = await import("@trellis/tooling");
    const result = await ensureModels({
      repository,
      progress: false,
      log: (line) => logger.info({ repository }, line),
      warn: (line) => logger.warn({ repository }, line),
    });
    if (result.source === "synthetic") {
      // The onnx backend logs the load with "synthetic": true (it reads the model's marker), as this says.
      const banner =
        "!!! OFFLINE: serving a SYNTHETIC ResNet-50 with random weights. Classifications are meaningless. Run `pnpm models:fetch` when online, then restart. !!!";
      logger.warn({ repository, model: result.modelPath }, banner);
      process.stderr.write(`\n${banner}\n\n`);
    } else if (result.source !== "bundled") {
      // The bundled model is announced by announceBundledModel, on this start and every later one.
      logger.info({ repository, model: result.modelPath, source: result.source }, "model weights ready");
    }
  }
}

/** At start: with --fetch-models, the seed's missing artifacts (ensureSeedModels); then, always, announceBundledModel. */
export async function prepareSeedModels(repositories: string[], logger: Logger, fetch: boolean): Promise<void> {
  if (fetch) await ensureSeedModels(repositories, logger);
  await announceBundledModel(repositories, logger);
}

/**
 * One line for each repository whose seed inference model is the bundled MobileNetV2 (the offline
 * fallback, or the container image's default repository), naming the model, at every start.
 */
export async function announceBundledModel(repositories: string[], logger: Logger): Promise<void> {
  for (const repository of repositories) {
    if (!(await isSeedRepository(repository))) continue;
    const file = join(repository, await configuredModelFile(repository));
    if (await isBundledModel(file)) logger.info({ model: "resnet50_inference", repository }, BUNDLED_NOTICE);
  }
}
