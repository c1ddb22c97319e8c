/**
 * What a server runs at start on a fresh machine: the real ResNet-50 when the network allows,
 * else the bundled MobileNetV2 (a real ImageNet classifier shipped in tooling/bundled, the same
 * tensor names and shapes), and only if that is missing too the synthetic stand-in, loudly labelled.
 */
import { copyFile, mkdir, open, rename, rm } from "node:fs/promises";
import { dirname, join } from "node:path";
import { DownloadError, type FetchModelsOptions, fetchModels, OfflineError } from "./fetch.js";
import {
  BUNDLED_DIR,
  BUNDLED_LABELS_FILE,
  BUNDLED_MODEL_FILE,
  exists,
  hasSeedArtifacts,
  INFERENCE_MODEL,
  isBundledModel,
  LABELS_FILE,
} from "./paths.js";
import { synthesizeResNet50, writeSyntheticLabels } from "./synth.js";

export interface EnsureModelsResult {
  /**
   * "present": nothing to do; "fetched": the real ResNet-50 and labels; "bundled": offline, the
   * bundled MobileNetV2 and real labels; "synthetic": offline without the bundled files.
   */
  source: "present" | "fetched" | "bundled" | "synthetic";
  modelPath: string;
  labelsPath: string;
}

export interface EnsureModelsOptions extends FetchModelsOptions {
  /** The synthetic model's seed (the last resort). */
  seed?: number;
  /** Where the bundled model and labels are (default tooling/bundled). */
  bundledDir?: string;
  warn?: (line: string) => void;
}

/** Why the download failed, in one phrase: the host and the connection's error, or the HTTP failure. */
function whyNotFetched(err: OfflineError | DownloadError): string {
  if (err instanceof OfflineError) return `cannot reach ${err.host}${err.detail ? ` (${err.detail})` : ""}`;
  return err.message;
}

/** The first line of a label file (undefined when there is none). */
async function firstLine(path: string): Promise<string | undefined> {
  const fh = await open(path, "r").catch(() => undefined);
  if (!fh) return undefined;
  try {
    const buf = Buffer.alloc(64);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    return buf.subarray(0, bytesRead).toString("utf8").split("\n")[0];
  } finally {
    await fh.close();
  }
}

/** Copies through a temp file renamed into place, so a reader never sees half a file. */
async function install(from: string, to: string): Promise<void> {
  await mkdir(dirname(to), { recursive: true });
  const part = `${to}.part`;
  try {
    await copyFile(from, part);
    await rename(part, to);
  } catch (err) {
    await rm(part, { force: true });
    throw err;
  }
}

/**
 * Offline: the bundled MobileNetV2 where the model is missing, and its real labels where the
 * labels are missing or are the synthetic placeholders. An existing model (a fetched ResNet-50,
 * one of the user's) is never replaced. False when the bundled files are not there (an npm install).
 */
async function installBundled(bundledDir: string, modelPath: string, labelsPath: string): Promise<boolean> {
  const model = join(bundledDir, BUNDLED_MODEL_FILE);
  const labels = join(bundledDir, BUNDLED_LABELS_FILE);
  if (!(await isBundledModel(model)) || !(await exists(labels))) return false;
  if (!(await exists(modelPath))) await install(model, modelPath);
  const current = await firstLine(labelsPath);
  if (current === undefined || current.startsWith("synthetic_class_")) await install(labels, labelsPath);
  return true;
}

/**
 * Fetches the real artifacts if the model is missing; when the download fails for good (offline,
 * or an HTTP error after its retries) installs the bundled MobileNetV2 instead and says why (the
 * last error); without the bundled files, synthesises a stand-in.
 */
export async function ensureModels(options: EnsureModelsOptions): Promise<EnsureModelsResult> {
  const log = options.log ?? ((line: string) => process.stderr.write(`${line}\n`));
  const warn = options.warn ?? log;
  const modelPath = join(options.repository, INFERENCE_MODEL);
  const labelsPath = join(options.repository, LABELS_FILE);
  if (await hasSeedArtifacts(options.repository)) return { source: "present", modelPath, labelsPath };
  try {
    await fetchModels({ ...options, log });
    return { source: "fetched", modelPath, labelsPath };
  } catch (err) {
    if (!(err instanceof OfflineError || err instanceof DownloadError)) throw err;
    if (await installBundled(options.bundledDir ?? BUNDLED_DIR, modelPath, labelsPath)) {
      warn(`ResNet-50 not downloaded: ${whyNotFetched(err)}. Serving the bundled MobileNetV2 (real ImageNet classes).`);
      return { source: "bundled", modelPath, labelsPath };
    }
    warn(
      `WARNING: ResNet-50 not downloaded: ${whyNotFetched(err)}, and no bundled model. Falling back to a SYNTHETIC ResNet-50 (random weights, meaningless predictions).`,
    );
    if (!(await exists(modelPath))) await synthesizeResNet50({ seed: options.seed ?? 0, path: modelPath });
    if (await writeSyntheticLabels(labelsPath)) {
      warn(
        `WARNING: wrote placeholder labels synthetic_class_<i> to ${labelsPath}; run \`pnpm models:fetch\` for the real ones.`,
      );
    }
    return { source: "synthetic", modelPath, labelsPath };
  }
}
