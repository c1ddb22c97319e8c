/**
 * What the inference service needs from whoever hosts models: a lookup from
 * (name, version) to a Stage, plus optional repository control. A single
 * stage, the ensemble runner and the server's repository manager all fit.
 */

import type { Stage } from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";

export interface ModelIndexEntry {
  name: string;
  version: string;
  /** Triton's states: READY, UNAVAILABLE, LOADING, UNLOADING. */
  state: string;
  reason: string;
}

export interface ModelLoadOptions {
  /** A model config in Triton's JSON form to load with instead of the repository's config.pbtxt. */
  config?: string;
  /**
   * Triton's file overrides ("file:<path>" load parameters): the model's folder made of
   * these files instead of the repository's, by path inside it ("1/model.onnx"). Needs `config`.
   */
  files?: Record<string, Uint8Array>;
}

export interface ModelUnloadOptions {
  /**
   * Triton's "unload_dependents": an ensemble's composing models are unloaded too (nested
   * ensembles' as well), except those another loaded model still uses.
   */
  unloadDependents?: boolean;
}

/** What one load request may upload: checked as its parameters are read, before any file is decoded. */
export interface ModelLoadLimits {
  /** Most file overrides (--max-load-files). */
  maxFiles: number;
  /** Most bytes of file overrides together (--max-load-bytes). */
  maxBytes: number;
}

export interface ModelRepositoryControl {
  /** Bounds on a load request's files; without them, only the request's own size bounds them. */
  loadLimits?: ModelLoadLimits;
  index(readyOnly: boolean): ModelIndexEntry[] | Promise<ModelIndexEntry[]>;
  load(name: string, options?: ModelLoadOptions): Promise<void>;
  unload(name: string, options?: ModelUnloadOptions): Promise<void>;
}

/** A model looked up for one request and held until `release` (see ModelRegistry.acquire). */
export interface HeldModel {
  stage: Stage;
  /** Ends the hold; calling it again does nothing. */
  release(): void;
}

export interface ModelRegistry {
  /** The stage serving name/version ("" = by policy, usually latest); throws NOT_FOUND or UNAVAILABLE. */
  resolve(name: string, version?: string): Stage;
  /**
   * As `resolve`, and held for one request until released (Triton's model handle): an unload or
   * reload of that version waits for the hold. A registry without it is looked up with `resolve`,
   * nothing held (see acquireModel).
   */
  acquire?(name: string, version?: string): HeldModel;
  /** Every stage currently loaded (for statistics over all models). */
  list(): Stage[];
  /** Server readiness; defaults to "every loaded stage is ready". */
  isReady?(): boolean | Promise<boolean>;
  repository?: ModelRepositoryControl;
}

/** The model for one request: held where the registry can hold it, else looked up. */
export function acquireModel(registry: ModelRegistry, name: string, version?: string): HeldModel {
  if (registry.acquire) return registry.acquire(name, version);
  return { stage: registry.resolve(name, version), release: () => undefined };
}

/** A registry over a fixed set of stages, e.g. one stage served as a microservice. */
export function stageRegistry(...stages: Stage[]): ModelRegistry {
  return {
    resolve(name, version) {
      const stage = stages.find((s) => s.name === name);
      if (!stage) throw new StageError(Code.NotFound, "", `unknown model "${name}"`);
      if (version && version !== stage.version) {
        throw new StageError(Code.NotFound, "", `model "${name}" has no version ${version} (serving ${stage.version})`);
      }
      return stage;
    },
    list: () => stages,
  };
}
