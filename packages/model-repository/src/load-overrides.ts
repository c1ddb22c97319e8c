/**
 * Loads with overrides from a client: a load request's JSON config in place of config.pbtxt, and a
 * load with file overrides (the model's folder made of the request's files), each checked first:
 * the request's size, its names, and the uploaded-code refusal (--allow-unsafe-load-overrides).
 */
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { type ModelLoadOptions, modelNameRefusal, tooManyLoadBytes, tooManyLoadFiles } from "@trellis/kserve";
import { type ModelConfig, parseModelConfigJson } from "@trellis/protocol";
import { Code, StageError } from "@trellis/stage";
import pLimit from "p-limit";
import type { ResolvedOptions } from "./manager-options.js";
import { byVersion } from "./registry.js";
import type { RepositoryModel } from "./scan.js";
import { normalizedUploadPath, uploadedCodeProblem } from "./upload-policy.js";

/** How many of a load's files are written at once. */
const LOAD_WRITE_CONCURRENCY = 16;

/** What a load with file overrides needs from the manager. */
export interface FileLoadContext {
  opts: Pick<ResolvedOptions, "maxLoadFiles" | "maxLoadBytes" | "allowUnsafeLoadOverrides">;
  /** The repository's config of the model, if it has one: what the overrides are judged against. */
  repositoryConfig: ModelConfig | undefined;
  /** Why a config asks more of the server than one model may (see configBoundsProblem). */
  boundsProblem(config: ModelConfig): string | undefined;
  /** The next load's number. */
  nextLoad(): number;
  /** Loads the model made of the files (an ensemble's steps first): why each selected version failed. */
  load(model: RepositoryModel): Promise<string[]>;
}

/**
 * Triton's load with file overrides: the model's folder made of the request's files, with
 * the request's config, whether or not the repository has the model. The folder is written
 * to a temporary directory and removed once the load is over (a loaded model reads its
 * files while loading only); a later load without files goes back to the repository.
 */
export async function loadFromFiles(name: string, options: ModelLoadOptions, context: FileLoadContext): Promise<void> {
  const fail = (why: string) => new StageError(Code.InvalidArgument, "", `failed to load '${name}': ${why}`);
  if (options.config === undefined) {
    // Triton's answer (INTERNAL): its repository agent refuses the files, and the poll fails.
    throw new StageError(
      Code.Internal,
      "",
      `${notPolled(name)}: Load parameter 'config' must be specified for model file override (the model config as JSON)`,
    );
  }
  checkLoadSize(name, options.files ?? {}, context.opts);
  // Every name judged as it will be written (see upload-policy.ts), before anything is.
  const files = new Map<string, Uint8Array>();
  const sent = new Map<string, string>();
  for (const [path, bytes] of Object.entries(options.files ?? {})) {
    const normalized = normalizedUploadPath(path);
    if (normalized === undefined) throw fail(`file override 'file:${path}' must be a path inside the model's folder`);
    if (files.has(normalized)) throw fail(`file override 'file:${path}' names the file '${normalized}' again`);
    files.set(normalized, bytes);
    sent.set(normalized, path);
  }
  const config = configFromJson(name, options.config);
  checkOverride(name, config, sent, context.opts.allowUnsafeLoadOverrides, context.repositoryConfig);
  const bounds = context.boundsProblem(config);
  if (bounds) throw fail(bounds);
  const root = await mkdtemp(join(tmpdir(), "trellis-load-"));
  try {
    const modelDir = join(root, name);
    const targets = [...files].map(([path, bytes]) => [join(modelDir, ...path.split("/")), bytes] as const);
    await writeFiles(targets, (path) =>
      fail(`file override 'file:${path.slice(modelDir.length + 1)}' could not be written`),
    );
    const versions = (await readdir(modelDir, { withFileTypes: true }))
      .filter((d) => d.isDirectory() && /^\d+$/.test(d.name))
      .map((d) => d.name)
      .sort(byVersion);
    const model: RepositoryModel = {
      name,
      repository: root,
      modelDir,
      configPath: join(modelDir, "config.pbtxt"),
      // Unlike any earlier load's: each load with files loads afresh.
      configText: `file overrides (load ${context.nextLoad()}):\n${options.config}`,
      config,
      versions,
    };
    const failures = await context.load(model);
    if (failures.length > 0) throw fail(failures.join("; "));
  } finally {
    await rm(root, { recursive: true, force: true });
  }
}

/** A load request's files, refused (INVALID_ARGUMENT, naming the flag) past --max-load-files or --max-load-bytes. */
export function checkLoadSize(
  name: string,
  files: Record<string, Uint8Array>,
  limits: { maxLoadFiles: number; maxLoadBytes: number },
): void {
  // The frontends count them as they read the request (see loadLimits); checked again for other callers.
  const paths = Object.keys(files);
  if (paths.length > limits.maxLoadFiles) throw tooManyLoadFiles(name, paths.length, limits.maxLoadFiles);
  let bytes = 0;
  for (const path of paths) bytes += (files[path] as Uint8Array).byteLength;
  if (bytes > limits.maxLoadBytes) throw tooManyLoadBytes(name, bytes, limits.maxLoadBytes);
}

/**
 * A load request's overrides come from a client: unless the operator allowed unsafe overrides,
 * they may not upload code (a TypeScript stage's model.js would run in the server) nor change
 * the model's `parameters`, which name the code a stage runs, the files it reads and the
 * endpoints it connects to. What else a config says (batching, instances, inputs) stays open.
 */
export function checkOverride(
  name: string,
  config: ModelConfig,
  files: ReadonlyMap<string, string>,
  allowUnsafeLoadOverrides: boolean,
  repository: ModelConfig | undefined,
): void {
  if (allowUnsafeLoadOverrides) return;
  const refuse = (why: string) =>
    new StageError(
      Code.PermissionDenied,
      "",
      `failed to load '${name}': ${why}; the server refuses this unless started with --allow-unsafe-load-overrides`,
    );
  for (const [path, asSent] of files) {
    const problem = uploadedCodeProblem(path, config, repository);
    const written = asSent === path ? "" : ` (written as '${path}')`;
    if (problem) throw refuse(`file override 'file:${asSent}'${written} ${problem}`);
  }
  if (
    config.backend === "python" &&
    (repository?.backend !== "python" || repository.defaultModelFilename !== config.defaultModelFilename)
  )
    throw refuse("the 'config' parameter makes the model run Python code its repository config does not name");
  const ours = repository?.parameters ?? {};
  const theirs = config.parameters;
  const changed = [...new Set([...Object.keys(ours), ...Object.keys(theirs)])].filter(
    (key) => ours[key]?.stringValue !== theirs[key]?.stringValue,
  );
  if (changed.length > 0) {
    const list = changed.map((k) => `"${k}"`).join(", ");
    throw refuse(`the 'config' parameter changes the model's parameters ${list} from the repository's config`);
  }
}
/**
 * The model with a load request's JSON config in place of its config.pbtxt,
 * as Triton's load with a "config" parameter: the model's files still come
 * from its folder, and a later load without one goes back to config.pbtxt
 * (the config text differs, so it reloads).
 */
export function withConfig(model: RepositoryModel, json: string): RepositoryModel {
  return { ...model, config: configFromJson(model.name, json), configText: `config parameter:\n${json}` };
}

/** The start of Triton's refusal of a load its repository poll could not serve (model_repository_manager.cc). */
export const notPolled = (name: string) => `failed to load '${name}', failed to poll from model repository`;

/** `name` from a client's load or unload, refused (INVALID_ARGUMENT) when it cannot name a model. */
export function checkedName(name: string, action: string): string {
  const refusal = modelNameRefusal(name, `failed to ${action} ${JSON.stringify(name)}`);
  if (refusal) throw new StageError(Code.InvalidArgument, "", refusal);
  return name;
}

/** A load request's JSON config for model `name` (which it must not rename). */
export function configFromJson(name: string, json: string): ModelConfig {
  let config: ModelConfig;
  try {
    config = parseModelConfigJson(json, "the load request's 'config' parameter");
  } catch (err) {
    throw new StageError(Code.InvalidArgument, "", `failed to load '${name}': ${(err as Error).message}`);
  }
  if (config.name && config.name !== name) {
    throw new StageError(
      Code.InvalidArgument,
      "",
      `failed to load '${name}': the 'config' parameter names model '${config.name}'`,
    );
  }
  config.name = name;
  return config;
}

/**
 * Writes a load's files, LOAD_WRITE_CONCURRENCY at a time (each folder made once): the event loop
 * keeps answering other requests however many there are. A file that cannot be written fails the
 * load with `fail`'s words (the filesystem's error, which names the server's paths, goes nowhere).
 */
async function writeFiles(
  targets: (readonly [string, Uint8Array])[],
  fail: (path: string) => StageError,
): Promise<void> {
  const folders = [...new Set(targets.map(([target]) => dirname(target)))].sort();
  const slots = pLimit(LOAD_WRITE_CONCURRENCY);
  await Promise.all(
    folders.map((folder) =>
      slots(() =>
        mkdir(folder, { recursive: true }).catch(() => {
          throw fail(folder);
        }),
      ),
    ),
  );
  await Promise.all(
    targets.map(([target, bytes]) =>
      slots(() =>
        writeFile(target, bytes).catch(() => {
          throw fail(target);
        }),
      ),
    ),
  );
}
