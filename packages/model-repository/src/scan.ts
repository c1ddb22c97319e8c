/**
 * Triton's model repository layout: `<repository>/<model>/config.pbtxt`
 * plus numeric version folders.
 */
import { readdir, readFile, stat } from "node:fs/promises";
import { dirname, join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { type ModelConfig, ModelConfigSchema, parseModelConfig } from "@trellis/protocol";

export interface RepositoryModel {
  name: string;
  repository: string;
  modelDir: string;
  configPath: string;
  /** config.pbtxt as read, for comparing against a later scan. */
  configText: string;
  config: ModelConfig;
  /** Numeric version folder names, ascending numerically. */
  versions: string[];
}

export interface RepositoryScan {
  models: RepositoryModel[];
  /** Folders passed over: neither a config.pbtxt nor a numeric version folder, so not a model (e.g. models/gpu). */
  skipped: string[];
  /** Models that could not be read (bad config, name clash); the rest still load. */
  errors: { name: string; modelDir: string; error: Error }[];
}

/**
 * A repository to scan, with models served under other names than their folders'
 * (folder -> name), as Triton's repository registration maps them (SageMaker's
 * multi-model endpoint serves a folder under the name of the archive it came from).
 */
export interface RepositorySource {
  path: string;
  names?: Record<string, string>;
}

const isDir = async (path: string) => (await stat(path).catch(() => undefined))?.isDirectory() ?? false;

/**
 * Lists every model in `repositories`. A model whose config.pbtxt is missing
 * or fails to parse, or whose name is taken by an earlier repository, is
 * reported in `errors`, not thrown. A folder with neither a config.pbtxt nor
 * a version folder is not a model and is listed in `skipped`.
 */
export async function scanRepository(repositories: (string | RepositorySource)[]): Promise<RepositoryScan> {
  const models: RepositoryModel[] = [];
  const errors: RepositoryScan["errors"] = [];
  const skipped: string[] = [];
  for (const source of repositories) {
    const { path: repository, names = {} } = typeof source === "string" ? { path: source } : source;
    const entries = await readdir(repository, { withFileTypes: true });
    for (const entry of entries.sort((a, b) => a.name.localeCompare(b.name))) {
      if (entry.name.startsWith(".")) continue;
      // A model folder may be a symbolic link (models kept on a shared volume), as Triton follows one.
      const folder = entry.isDirectory() || (entry.isSymbolicLink() && (await isDir(join(repository, entry.name))));
      if (!folder) continue;
      const mapped = Object.hasOwn(names, entry.name);
      const name = mapped ? (names[entry.name] as string) : entry.name;
      const modelDir = join(repository, entry.name);
      const configPath = join(modelDir, "config.pbtxt");
      const versions: string[] = [];
      for (const v of await readdir(modelDir)) {
        if (/^\d+$/.test(v) && (await isDir(join(modelDir, v)))) versions.push(v);
      }
      versions.sort((a, b) => Number(a) - Number(b));
      const hasConfig = (await stat(configPath).catch(() => undefined)) !== undefined;
      if (!hasConfig && versions.length === 0) {
        skipped.push(modelDir);
        continue;
      }
      try {
        // As Triton: a folder without config.pbtxt whose version folder holds model.py is a Python
        // model, its config completed at load by its auto_complete_config (configText "": none).
        const python = !hasConfig && (await hasPythonModel(modelDir, versions));
        if (!hasConfig && !python) throw new Error(`${configPath}: no config.pbtxt`);
        const configText = python ? "" : await readFile(configPath, "utf8");
        const config = python
          ? create(ModelConfigSchema, { name, backend: "python" })
          : parseModelConfig(configText, configPath);
        // A mapped folder is served under the name it is mapped to, whatever its config calls it.
        if (!config.name || mapped) config.name = name;
        if (config.name !== name) {
          throw new Error(`${configPath}: config name "${config.name}" does not match its directory "${name}"`);
        }
        models.push({ name, repository, modelDir, configPath, configText, config, versions });
      } catch (err) {
        errors.push({ name, modelDir, error: err instanceof Error ? err : new Error(String(err)) });
      }
    }
  }
  // As Triton: a name found in more than one repository is ambiguous, so none of them loads.
  const dirsByName = new Map<string, string[]>();
  for (const { name, modelDir } of [...models, ...errors])
    dirsByName.set(name, [...(dirsByName.get(name) ?? []), modelDir]);
  // Clients read this reason too: the repositories by their place on the command line, not their paths.
  const paths = repositories.map((r) => (typeof r === "string" ? r : r.path));
  const place = (dir: string) => `#${paths.indexOf(dirname(dir)) + 1}`;
  const clashes = [...dirsByName].filter(([, dirs]) => dirs.length > 1);
  if (clashes.length === 0) return { models, errors, skipped };
  const clashing = new Set(clashes.map(([name]) => name));
  return {
    models: models.filter((m) => !clashing.has(m.name)),
    errors: [
      ...errors.filter((e) => !clashing.has(e.name)),
      ...clashes.map(([name, dirs]) => ({
        name,
        modelDir: dirs[0] as string,
        error: new Error(
          `model "${name}" is in more than one repository (repositories ${dirs.map(place).join(", ")}): none of them is loaded`,
        ),
      })),
    ],
    skipped,
  };
}

/** Whether a version folder of `modelDir` holds model.py (a Python model's default file). */
async function hasPythonModel(modelDir: string, versions: readonly string[]): Promise<boolean> {
  for (const v of versions) if (await stat(join(modelDir, v, "model.py")).catch(() => undefined)) return true;
  return false;
}

/**
 * Reads a deployment's endpoint map: a JSON object from model name to the
 * KServe v2 gRPC base URL serving it, e.g.
 * `{ "resnet50_inference": "http://10.0.0.7:8001" }`.
 */
export async function readEndpointsFile(path: string): Promise<Record<string, string>> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(await readFile(path, "utf8"));
  } catch (err) {
    throw new Error(`${path}: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) {
    throw new Error(`${path}: expected a JSON object mapping model names to URLs`);
  }
  const out: Record<string, string> = {};
  for (const [model, url] of Object.entries(parsed)) {
    if (typeof url !== "string") throw new Error(`${path}: endpoint for "${model}" must be a string URL`);
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      throw new Error(`${path}: endpoint for "${model}" is not a URL: "${url}"`);
    }
    if (u.protocol !== "http:" && u.protocol !== "https:") {
      throw new Error(`${path}: endpoint for "${model}" must be http:// or https://, got "${url}"`);
    }
    out[model] = url.replace(/\/+$/, "");
  }
  return out;
}
