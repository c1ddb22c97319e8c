/**
 * What a server runs at start on a fresh machine: the real models when the
 * network allows, else the synthetic stand-in, loudly labelled.
 */
import { join } from "node:path";
import { DownloadError, type FetchModelsOptions, fetchModels, OfflineError } from "./fetch.js";
import { hasSeedArtifacts, INFERENCE_MODEL, LABELS_FILE } from "./paths.js";
import { synthesizeResNet50, writeSyntheticLabels } from "./synth.js";

export interface EnsureModelsResult {
  /** "present": nothing to do; "fetched": real artifacts; "synthetic": offline fallback. */
  source: "present" | "fetched" | "synthetic";
  modelPath: string;
  labelsPath: string;
}

/**
 * Fetches the real artifacts if the model is missing; offline, or when the download fails
 * after its retries, synthesises a stand-in instead and says why (the last error).
 */
export async function ensureModels(
  options: FetchModelsOptions & { seed?: number; warn?: (line: string) => void },
): Promise<EnsureModelsResult> {
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
    const why = err instanceof OfflineError && err.detail ? `${err.message} (${err.detail})` : err.message;
    warn(`WARNING: ${why}. Falling back to a SYNTHETIC ResNet-50 (random weights, meaningless predictions).`);
    await synthesizeResNet50({ seed: options.seed ?? 0, path: modelPath });
    if (await writeSyntheticLabels(labelsPath)) {
      warn(
        `WARNING: wrote placeholder labels synthetic_class_<i> to ${labelsPath}; run \`pnpm models:fetch\` for the real ones.`,
      );
    }
    return { source: "synthetic", modelPath, labelsPath };
  }
}
