/**
 * The manager's per-model records: each model's entry and its versions' states, and what is
 * read off them (the versions a version policy selects, loaded or not, an ensemble's steps).
 */
import type { ModelConfig } from "@trellis/protocol";
import type { Model } from "@trellis/runtime";
import type { RepositoryModel } from "./scan.js";

export type State = "READY" | "UNAVAILABLE" | "LOADING" | "UNLOADING";

export interface VersionEntry {
  version: string;
  state: State;
  reason: string;
  /** The loaded version: the one object the server holds for it. */
  stage?: Model;
}

export interface ModelEntry {
  name: string;
  model?: RepositoryModel;
  /** Why the model could not even be read (bad config.pbtxt). */
  scanError?: string;
  versions: Map<string, VersionEntry>;
  /** Serialises load/unload of one model. */
  queue: Promise<void>;
  /** What the model was last loaded from (see sourceOf): a load or poll reloads only when it changed. */
  loadedFrom?: string;
  /** The models the loaded ensemble calls (its steps; none for other models): what unload_dependents unloads. */
  steps: string[];
}

export const isEnsemble = (config: ModelConfig) => config.schedulingChoice.case === "ensembleScheduling";

export function ensembleSteps(config: ModelConfig): { model: string; version: bigint }[] {
  const s = config.schedulingChoice;
  return s.case === "ensembleScheduling"
    ? s.value.step.map((st) => ({ model: st.modelName, version: st.modelVersion }))
    : [];
}

/** A version of the model is loaded, or loading. */
export const isLoaded = (e: ModelEntry) =>
  [...e.versions.values()].some((v) => v.state === "READY" || v.state === "LOADING");

export const byVersion = (a: string, b: string) => Number(a) - Number(b) || a.localeCompare(b);

/** The versions a model's version_policy selects (default: latest 1), ascending. */
export function selectVersions(config: ModelConfig, available: string[]): string[] {
  const sorted = [...available].sort(byVersion);
  const policy = config.versionPolicy?.policyChoice;
  if (policy?.case === "all") return sorted;
  if (policy?.case === "specific") {
    const wanted = new Set(policy.value.versions.map(String));
    return sorted.filter((v) => wanted.has(v));
  }
  const n = policy?.case === "latest" ? Math.max(1, policy.value.numVersions) : 1;
  return sorted.slice(-n);
}

/** Runs `fn` after the model's loads and unloads queued before it: one at a time per model. */
export function enqueue<T>(e: ModelEntry, fn: () => Promise<T>): Promise<T> {
  const run = e.queue.then(fn);
  e.queue = run.then(
    () => undefined,
    () => undefined,
  );
  return run;
}
