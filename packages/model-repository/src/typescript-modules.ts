/**
 * TypeScript stage modules (`backend: "typescript"`, and stage packages such as ONNX's): finding
 * a model's module, importing it, its stage factory, and its instances in worker threads.
 */
import { stat } from "node:fs/promises";
import { basename, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { instanceCount, startWorkerInstances } from "@trellis/runtime";
import {
  Code,
  configParameter,
  type Stage,
  StageError,
  type StageFactory,
  type StageFactoryOptions,
} from "@trellis/stage";
import type { RepositoryModel } from "./scan.js";

/** Whether `path` is a file. */
export const exists = async (path: string) => (await stat(path).catch(() => undefined))?.isFile() ?? false;

/** The factory a module exports: `createStage`, else a default-exported function. */
export function factoryOf(mod: Record<string, unknown>, where: string, model: string): StageFactory {
  const f = mod.createStage ?? mod.default;
  if (typeof f !== "function") {
    throw new StageError(Code.InvalidArgument, model, `${where} exports neither createStage nor a default function`);
  }
  return f as StageFactory;
}

export async function importModule(specifier: string, model: string): Promise<Record<string, unknown>> {
  try {
    return (await import(specifier)) as Record<string, unknown>;
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    // Node names the importing file; when that is this loader, it says nothing about the model.
    const own = ` imported from ${fileURLToPath(import.meta.url)}`;
    const why = message.endsWith(own) ? message.slice(0, -own.length) : message;
    throw new StageError(Code.NotFound, model, `cannot import ${specifier}: ${why}`, { cause: err });
  }
}

/** `backend: "typescript"`: the module named by parameter `module`, else `<versionDir>/model.js` / `model.mjs`. */
export async function typescriptFactory(model: RepositoryModel, versionDir: string): Promise<StageFactory> {
  const { specifier, where } = await typescriptModule(model, versionDir);
  return factoryOf(await importModule(specifier, model.name), where, model.name);
}

/** The stage module of a `backend: "typescript"` model: its specifier, and how errors call it. */
async function typescriptModule(
  model: RepositoryModel,
  versionDir: string,
): Promise<{ specifier: string; where: string; param?: string }> {
  const param = configParameter(model.config, "module");
  if (param) {
    // A path is the user's file (relative to the version folder); anything else is a package name.
    const isPath = param.startsWith(".") || isAbsolute(param);
    const specifier = isPath ? pathToFileURL(resolve(versionDir, param)).href : param;
    return { specifier, where: `module "${param}"`, param };
  }
  for (const file of ["model.js", "model.mjs"]) {
    const path = join(versionDir, file);
    if (await exists(path)) return { specifier: pathToFileURL(path).href, where: path };
  }
  throw new StageError(
    Code.InvalidArgument,
    model.name,
    `backend "typescript" needs a parameter "module" naming a stage package (e.g. "@trellis/preprocess") or a ${join(versionDir, "model.js")} exporting createStage`,
  );
}

/**
 * Parameter worker_threads "true": the stage's instances (instanceCount: the sum of instance_group counts, default 1)
 * each in a worker thread that loads the module; a package name is resolved here, where it is a dependency.
 */
export async function workerInstances(
  model: RepositoryModel,
  versionDir: string,
  factoryOptions: StageFactoryOptions,
): Promise<Stage> {
  const { specifier, where, param } = await typescriptModule(model, versionDir);
  let resolved = specifier;
  if (!specifier.startsWith("file:")) {
    try {
      resolved = import.meta.resolve(specifier);
    } catch (err) {
      const why = err instanceof Error ? err.message : String(err);
      const own = ` imported from ${fileURLToPath(import.meta.url)}`;
      const message = `cannot import ${specifier}: ${why.endsWith(own) ? why.slice(0, -own.length) : why}`;
      throw new StageError(Code.NotFound, model.name, message, { cause: err });
    }
  }
  const { config, modelDir, version } = factoryOptions;
  return startWorkerInstances({
    specifier: resolved,
    label: param ? where : basename(where),
    factoryOptions: { config, modelDir, version, versionDir },
    instances: instanceCount(config),
    ...(factoryOptions.logger ? { logger: factoryOptions.logger } : {}),
    ...(factoryOptions.cpuGate ? { cpuGate: factoryOptions.cpuGate } : {}),
  });
}
