/**
 * The repository manager's options (RepositoryManagerOptions, with their defaults), the
 * model loader it is given (ModelLoader), and its control modes.
 */
import type { ResponseStore } from "@trellis/runtime";
import type { RateLimiter, Stage, StageLogger } from "@trellis/stage";
import { defaultMaxInstancesPerModel } from "./config-bounds.js";
import type { LoadStageOptions } from "./loader.js";
import { DEFAULT_MAX_QUEUE_SIZE } from "./managed-model.js";
import type { RepositoryModel, RepositoryScan, RepositorySource } from "./scan.js";

/** What the manager needs from a model loader (@trellis/ensemble-runner's, in production). */
export interface ModelLoader {
  scanRepository(repositories: RepositorySource[]): Promise<RepositoryScan>;
  loadStage(model: RepositoryModel, options: LoadStageOptions): Promise<Stage>;
  /** A remote model over KServe v2 gRPC (for ensemble steps only reachable through --endpoints). */
  connectRemote(name: string, url: string, version?: string): Promise<Stage>;
}

export type ControlMode = "none" | "explicit" | "poll";

export interface RepositoryManagerOptions {
  repositories: string[];
  loader: ModelLoader;
  mode?: ControlMode;
  /** Models to load at start in explicit mode ("*" = all). */
  loadModels?: string[];
  strictModelConfig?: boolean;
  /** max_batch_size auto-complete gives a batchable model whose config has none (--backend-config default-max-batch-size). */
  defaultMaxBatchSize?: number;
  /** Remote steps: model name -> KServe v2 gRPC URL. */
  endpoints?: Record<string, string>;
  /** The server's response cache (--cache-config); models whose config enables `response_cache` use it. */
  responseCache?: ResponseStore;
  /**
   * Ready only when every loaded model is (default true, tritonserver's --strict-readiness);
   * false: ready whenever the server is up, whatever its models are doing.
   */
  strictReadiness?: boolean;
  logger: StageLogger & { debug?(obj: object | string, msg?: string): void };
  pollIntervalMs?: number;
  /** How many models (or versions) load at once (tritonserver's --model-load-thread-count; default 4). Ensembles, which only wire their steps, are not counted. */
  loadConcurrency?: number;
  /** How many more times a failing load is tried (tritonserver's --model-load-retry-count; default 0). */
  loadRetries?: number;
  /** The rate limiter model instances run under (tritonserver's --rate-limit execution_count). */
  rateLimiter?: RateLimiter;
  /** Queue bound of a model whose config sets no max_queue_size (--default-max-queue-size; 0: unbounded; default DEFAULT_MAX_QUEUE_SIZE). */
  defaultMaxQueueSize?: number;
  /** Python models (backend "python"): which python3 runs them (--python-executable), each execution's deadline. */
  python?: LoadStageOptions["python"];
  /**
   * Lets a load request's overrides upload executable code and change a model's `parameters`
   * (which name code, files and endpoints): --allow-unsafe-load-overrides, default false.
   */
  allowUnsafeLoadOverrides?: boolean;
  /** Instances one model may run, summed over its instance groups (--max-instances-per-model; default defaultMaxInstancesPerModel()). */
  maxInstancesPerModel?: number;
  /** Files one load request may upload (--max-load-files; default DEFAULT_MAX_LOAD_FILES). */
  maxLoadFiles?: number;
  /** Bytes one load request may upload, its files together (--max-load-bytes; default DEFAULT_MAX_LOAD_BYTES). */
  maxLoadBytes?: number;
}

/** --max-load-files's default: more files than any model folder we know of has. */
export const DEFAULT_MAX_LOAD_FILES = 1000;
/** --max-load-bytes's default: 1 GiB. */
export const DEFAULT_MAX_LOAD_BYTES = 1024 * 1024 * 1024;

/** The options as the manager holds them: its defaults filled in. */
export type ResolvedOptions = Required<
  Omit<
    RepositoryManagerOptions,
    | "endpoints"
    | "responseCache"
    | "defaultMaxBatchSize"
    | "loadConcurrency"
    | "rateLimiter"
    | "defaultMaxQueueSize"
    | "maxInstancesPerModel"
    | "maxLoadFiles"
    | "maxLoadBytes"
    | "python"
  >
> & {
  python?: LoadStageOptions["python"];
  maxInstancesPerModel: number;
  maxLoadFiles: number;
  maxLoadBytes: number;
  endpoints: Record<string, string>;
  responseCache?: ResponseStore;
  defaultMaxBatchSize?: number;
  rateLimiter?: RateLimiter;
  defaultMaxQueueSize: number;
};

/** `options` with the manager's defaults filled in. */
export function withDefaults(options: RepositoryManagerOptions): ResolvedOptions {
  return {
    mode: "none",
    loadModels: [],
    strictModelConfig: false,
    strictReadiness: true,
    pollIntervalMs: 15_000,
    loadRetries: 0,
    allowUnsafeLoadOverrides: false,
    ...options,
    endpoints: options.endpoints ?? {},
    defaultMaxQueueSize: options.defaultMaxQueueSize ?? DEFAULT_MAX_QUEUE_SIZE,
    maxInstancesPerModel: options.maxInstancesPerModel ?? defaultMaxInstancesPerModel(),
    maxLoadFiles: options.maxLoadFiles ?? DEFAULT_MAX_LOAD_FILES,
    maxLoadBytes: options.maxLoadBytes ?? DEFAULT_MAX_LOAD_BYTES,
  };
}
