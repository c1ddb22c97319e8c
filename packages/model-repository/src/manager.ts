/**
 * The model repository manager: scans Triton-layout repositories, loads the
 * versions each model's version policy selects, tracks per-version state
 * (READY / UNAVAILABLE / LOADING / UNLOADING) and serves them as a
 * ModelRegistry to both frontends.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import {
  createModelCaller,
  type ModelIndexEntry,
  type ModelLoadOptions,
  type ModelRegistry,
  type ModelRepositoryControl,
  type ModelUnloadOptions,
  modelNameRefusal,
  tooManyLoadBytes,
  tooManyLoadFiles,
} from "@trellis/kserve";
import { type ModelConfig, parseModelConfigJson } from "@trellis/protocol";
import { CpuGate, type ResponseStore } from "@trellis/runtime";
import { Code, type RateLimiter, type Stage, StageError, type StageLogger } from "@trellis/stage";
import { answersOf, delegateStage, modelFilePath } from "@trellis/stage/backend";
import pLimit, { type LimitFunction } from "p-limit";
import { configBoundsProblem, defaultMaxInstancesPerModel } from "./config-bounds.js";
import type { LoadStageOptions } from "./loader.js";
import { DEFAULT_MAX_QUEUE_SIZE, ManagedStage, type ModelCache } from "./managed-model.js";
import { connectWhenReachable } from "./remote-steps.js";
import type { RepositoryModel, RepositoryScan, RepositorySource } from "./scan.js";
import { ShadowComparer, shadowSettings } from "./shadow.js";
import { normalizedUploadPath, uploadedCodeProblem } from "./upload-policy.js";

/** What the manager needs from a model loader (@trellis/ensemble-runner's, in production). */
export interface ModelLoader {
  scanRepository(repositories: RepositorySource[]): Promise<RepositoryScan>;
  loadStage(model: RepositoryModel, options: LoadStageOptions): Promise<Stage>;
  /** A remote model over KServe v2 gRPC (for ensemble steps only reachable through --endpoints). */
  connectRemote(name: string, url: string, version?: string): Promise<Stage>;
}

export type ControlMode = "none" | "explicit" | "poll";
type State = "READY" | "UNAVAILABLE" | "LOADING" | "UNLOADING";

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
/** How many of a load's files are written at once. */
const LOAD_WRITE_CONCURRENCY = 16;

interface VersionEntry {
  version: string;
  state: State;
  reason: string;
  stage?: ManagedStage;
}

interface ModelEntry {
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

const isEnsemble = (config: ModelConfig) => config.schedulingChoice.case === "ensembleScheduling";

function ensembleSteps(config: ModelConfig): { model: string; version: bigint }[] {
  const s = config.schedulingChoice;
  return s.case === "ensembleScheduling"
    ? s.value.step.map((st) => ({ model: st.modelName, version: st.modelVersion }))
    : [];
}

/** A version of the model is loaded, or loading. */
const isLoaded = (e: ModelEntry) => [...e.versions.values()].some((v) => v.state === "READY" || v.state === "LOADING");

const byVersion = (a: string, b: string) => Number(a) - Number(b) || a.localeCompare(b);

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

export class RepositoryManager implements ModelRegistry {
  private readonly models = new Map<string, ModelEntry>();
  /** The process's CPU, shared by every model this manager loads: ONNX runs with exclusive_cpu against image decodes. */
  private readonly cpuGate = new CpuGate();
  private readonly opts: Required<
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
  /** Counts loads, so each load's cache entries are its own (a reload never answers from the old one's). */
  private loads = 0;
  private started = false;
  private closed = false;
  /** Set when shutdown begins: the server stops reporting ready at once, as Triton does. */
  private draining = false;
  private pollTimer?: NodeJS.Timeout;
  /** Remote ensemble steps by "name@version", shared by every ensemble (and reload) that uses them. */
  private readonly remoteSteps = new Map<string, Promise<Stage>>();
  /** Aborted at close: remote steps not answering yet are no longer waited for. */
  private readonly stopWaiting = new AbortController();
  /** What stage factories get as `models`: a TypeScript stage's calls to other models (Triton's BLS) resolve here. */
  private readonly modelCaller = createModelCaller((name, version) => this.resolve(name, version));
  /** Bounds the model loads under way (--model-load-thread-count). */
  private readonly loadSlots: LimitFunction;
  /** The repositories scanned: the command line's, then those registered at run time. */
  private readonly repositories: RepositorySource[];
  readonly repository: ModelRepositoryControl;

  constructor(options: RepositoryManagerOptions) {
    this.opts = {
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
    this.loadSlots = pLimit(options.loadConcurrency ?? 4);
    this.repositories = options.repositories.map((path) => ({ path }));
    this.repository = {
      loadLimits: { maxFiles: this.opts.maxLoadFiles, maxBytes: this.opts.maxLoadBytes },
      index: (readyOnly) => this.index(readyOnly),
      load: (name, options) => this.requestControl(() => this.load(checkedName(name, "load"), true, options)),
      unload: (name, options) => this.requestControl(() => this.unload(checkedName(name, "unload"), options)),
    };
  }

  get mode(): ControlMode {
    return this.opts.mode;
  }

  /** Scans the repositories and loads what the control mode says to load. */
  async start(): Promise<void> {
    const scan = await this.scan();
    if (this.opts.mode === "explicit") {
      const names = this.opts.loadModels.includes("*") ? scan.models.map((m) => m.name) : this.opts.loadModels;
      await this.loadMany(names);
    } else {
      // Models whose config is invalid are asked for too: they fail, and count as failed (readiness, --exit-on-error).
      await this.loadMany([...scan.models, ...scan.errors].map((m) => m.name));
    }
    this.started = true;
    if (this.opts.mode === "poll") this.schedulePoll();
  }

  /** Shutdown has begun: report not ready (load balancers move away) while in-flight requests finish. */
  beginShutdown(): void {
    this.draining = true;
  }

  /** Unloads everything (after in-flight requests finish). */
  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.pollTimer);
    // Before the unloads below, which queue behind loads still waiting for a remote step.
    this.stopWaiting.abort();
    // Ensembles first: they may still be calling their steps.
    const entries = [...this.models.values()].sort(
      (a, b) => Number(b.model ? isEnsemble(b.model.config) : 0) - Number(a.model ? isEnsemble(a.model.config) : 0),
    );
    for (const e of entries) await this.enqueue(e, () => this.unloadEntry(e));
    await Promise.allSettled([...this.remoteSteps.values()].map(async (s) => (await s).close()));
  }

  // ---- ModelRegistry ----

  resolve(name: string, version?: string): ManagedStage {
    const entry = this.models.get(name);
    if (!entry || entry.versions.size === 0) {
      throw new StageError(Code.NotFound, "", `Request for unknown model: '${name}' is not found`);
    }
    if (version) {
      const v = entry.versions.get(version);
      if (!v)
        throw new StageError(Code.NotFound, "", `Request for unknown model: '${name}' version ${version} is not found`);
      if (v.state !== "READY" || !v.stage) {
        throw new StageError(
          Code.Unavailable,
          "",
          `Request for unknown model: '${name}' version ${version} is not at ready state`,
        );
      }
      return v.stage;
    }
    const ready = [...entry.versions.values()].filter((v) => v.state === "READY" && v.stage);
    const latest = ready.sort((a, b) => byVersion(a.version, b.version)).at(-1);
    if (!latest?.stage) {
      // NOT_FOUND, as Triton's core (model_lifecycle.cc GetModel): no version to serve is no model to serve.
      throw new StageError(Code.NotFound, "", `Request for unknown model: '${name}' has no available versions`);
    }
    return latest.stage;
  }

  /** Versions of `name` that are READY, ascending (what model metadata lists). */
  readyVersions(name: string): string[] {
    const e = this.models.get(name);
    if (!e) return [];
    return [...e.versions.values()]
      .filter((v) => v.state === "READY")
      .map((v) => v.version)
      .sort(byVersion);
  }

  list(): ManagedStage[] {
    const out: ManagedStage[] = [];
    for (const e of this.models.values()) {
      for (const v of e.versions.values()) if (v.state === "READY" && v.stage) out.push(v.stage);
    }
    return out;
  }

  /**
   * Ready once the initial load is done and, with strict readiness (the default), every
   * model asked for is ready, as Triton's InferenceServer::IsReady: nothing mid-load/unload,
   * every loaded version reports ready, and none failed to load (a version that failed holds
   * readiness back until it loads or is unloaded: a probe must not send traffic to a server
   * missing a model it should serve).
   */
  async isReady(): Promise<boolean> {
    if (!this.started || this.closed || this.draining) return false;
    if (!this.opts.strictReadiness) return true;
    const checks: (boolean | Promise<boolean>)[] = [];
    for (const e of this.models.values()) {
      for (const v of e.versions.values()) {
        if (v.state === "LOADING" || v.state === "UNLOADING") return false;
        if (v.state === "UNAVAILABLE" && v.reason !== "unloaded") return false;
        if (v.state === "READY" && v.stage) checks.push(v.stage.isReady());
      }
    }
    return (await Promise.all(checks)).every(Boolean);
  }

  /** Models asked for with a version that failed to load (not unloaded since): what holds strict readiness back. */
  failedModels(): string[] {
    return [...this.models.values()]
      .filter((e) => [...e.versions.values()].some((v) => v.state === "UNAVAILABLE" && v.reason !== "unloaded"))
      .map((e) => e.name)
      .sort();
  }

  index(readyOnly: boolean): ModelIndexEntry[] {
    const rows: ModelIndexEntry[] = [];
    for (const e of [...this.models.values()].sort((a, b) => a.name.localeCompare(b.name))) {
      if (e.versions.size === 0) {
        if (readyOnly) continue;
        rows.push(
          e.scanError
            ? { name: e.name, version: "", state: "UNAVAILABLE", reason: e.scanError }
            : { name: e.name, version: "", state: "", reason: "" },
        );
        continue;
      }
      for (const v of [...e.versions.values()].sort((a, b) => byVersion(a.version, b.version))) {
        if (readyOnly && v.state !== "READY") continue;
        rows.push({ name: e.name, version: v.version, state: v.state, reason: v.reason });
      }
    }
    return rows;
  }

  // ---- loading ----

  private requestControl(fn: () => Promise<void>): Promise<void> {
    if (this.opts.mode !== "explicit") {
      throw new StageError(
        Code.Unavailable,
        "",
        "explicit model load / unload is not allowed if polling is enabled or model control mode is not explicit",
      );
    }
    return fn();
  }

  /**
   * Triton's repository registration (explicit mode): `path` joins the repositories scanned,
   * its folders named in `names` served under those names (folder -> name). A path already
   * registered, or a name a model already has, is refused (ALREADY_EXISTS).
   */
  async registerRepository(path: string, names: Record<string, string> = {}): Promise<void> {
    if (this.opts.mode !== "explicit") {
      throw new StageError(
        Code.Unavailable,
        "",
        "repository registration is not allowed if model control mode is not EXPLICIT",
      );
    }
    if (this.repositories.some((r) => r.path === path)) {
      throw new StageError(Code.AlreadyExists, "", `model repository '${path}' has already been registered`);
    }
    for (const name of Object.values(names)) {
      if (this.models.get(name)?.model) {
        throw new StageError(Code.AlreadyExists, "", `failed to register '${path}': a model named '${name}' exists`);
      }
    }
    this.repositories.push({ path, names });
  }

  /**
   * Takes a registered repository away: its models still loaded are unloaded (ensembles
   * first; in-flight requests finish) and all of its models leave the index.
   */
  async unregisterRepository(path: string): Promise<void> {
    const at = this.repositories.findIndex((r) => r.path === path);
    if (at < this.opts.repositories.length) {
      throw new StageError(Code.InvalidArgument, "", `failed to unregister '${path}': not a registered repository`);
    }
    this.repositories.splice(at, 1);
    // Rescanned first: a model of another repository that clashed with one of this one's is its own again.
    await this.scan();
    const own = [...this.models.values()].filter((e) => e.model?.repository === path);
    own.sort((a, b) => Number(b.steps.length > 0) - Number(a.steps.length > 0));
    for (const e of own) {
      await this.enqueue(e, () => this.unloadEntry(e));
      this.models.delete(e.name);
    }
  }

  private async scan(): Promise<RepositoryScan> {
    const scan = await this.opts.loader.scanRepository(this.repositories);
    for (const m of scan.models) {
      const e = this.entry(m.name);
      e.model = m;
      e.scanError = undefined;
    }
    for (const dir of scan.skipped)
      this.opts.logger.info({ dir }, "not a model (no config.pbtxt, no version folder): skipped");
    for (const err of scan.errors) {
      const e = this.entry(err.name);
      e.model = undefined;
      e.scanError = err.error.message;
      this.opts.logger.error({ model: err.name, reason: err.error.message }, "model configuration invalid");
    }
    return scan;
  }

  private entry(name: string): ModelEntry {
    let e = this.models.get(name);
    if (!e) {
      e = { name, versions: new Map(), queue: Promise.resolve(), steps: [] };
      this.models.set(name, e);
    }
    return e;
  }

  private enqueue<T>(e: ModelEntry, fn: () => Promise<T>): Promise<T> {
    const run = e.queue.then(fn);
    e.queue = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /** Loads non-ensembles concurrently, then ensembles (their steps must exist first). */
  private async loadMany(names: string[]): Promise<void> {
    const wanted = [...new Set(names)];
    const ensembles = wanted.filter((n) => {
      const m = this.models.get(n)?.model;
      return m && isEnsemble(m.config);
    });
    const plain = wanted.filter((n) => !ensembles.includes(n));
    await Promise.all(plain.map((n) => this.load(n, false).catch(() => undefined)));
    // A step that just failed is not tried (and its failure logged) again for each ensemble.
    const tried = new Set(plain);
    for (const n of ensembles) await this.load(n, false, {}, tried).catch(() => undefined);
  }

  /**
   * Loads (or reloads) `name` from the repository, its ensemble steps
   * first. Throws if any version fails; the failure stays in the index.
   */
  async load(name: string, rescan = true, options: ModelLoadOptions = {}, tried?: Set<string>): Promise<void> {
    if (rescan) await this.scan();
    if (options.files && Object.keys(options.files).length > 0) return this.loadFromFiles(name, options);
    const configOverride = options.config;
    const e = this.models.get(name);
    if (!e || (!e.model && !e.scanError)) {
      // Triton's answer (INTERNAL), its repository poll finding no such model folder.
      throw new StageError(Code.Internal, "", `${notPolled(name)}: no such model in the model repository`);
    }
    if (!e.model) {
      // Asked for and failed (its config): kept in the index as a failed load, as Triton's.
      e.versions.set("", { version: "", state: "UNAVAILABLE", reason: e.scanError ?? "" });
      throw new StageError(Code.InvalidArgument, "", `failed to load '${name}': ${e.scanError}`);
    }
    const model = configOverride === undefined ? e.model : withConfig(e.model, configOverride);
    if (configOverride !== undefined) this.checkOverride(name, model.config, new Map());
    if (isEnsemble(model.config)) await this.loadSteps(model, new Set([name, ...(tried ?? [])]));
    const failures = await this.enqueue(e, () => this.loadEntry(e, model));
    if (failures.length > 0) {
      throw new StageError(Code.InvalidArgument, "", `failed to load '${name}': ${failures.join("; ")}`);
    }
  }

  /**
   * Triton's load with file overrides: the model's folder made of the request's files, with
   * the request's config, whether or not the repository has the model. The folder is written
   * to a temporary directory and removed once the load is over (a loaded model reads its
   * files while loading only); a later load without files goes back to the repository.
   */
  private async loadFromFiles(name: string, options: ModelLoadOptions): Promise<void> {
    const fail = (why: string) => new StageError(Code.InvalidArgument, "", `failed to load '${name}': ${why}`);
    if (options.config === undefined) {
      // Triton's answer (INTERNAL): its repository agent refuses the files, and the poll fails.
      throw new StageError(
        Code.Internal,
        "",
        `${notPolled(name)}: Load parameter 'config' must be specified for model file override (the model config as JSON)`,
      );
    }
    this.checkLoadSize(name, options.files ?? {});
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
    this.checkOverride(name, config, sent);
    const bounds = this.boundsProblem(config);
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
        configText: `file overrides (load ${++this.loads}):\n${options.config}`,
        config,
        versions,
      };
      const e = this.entry(name);
      if (isEnsemble(model.config)) await this.loadSteps(model, new Set([name]));
      const failures = await this.enqueue(e, () => this.loadEntry(e, model));
      if (failures.length > 0) throw fail(failures.join("; "));
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  }

  /** A load request's files, refused (INVALID_ARGUMENT, naming the flag) past --max-load-files or --max-load-bytes. */
  private checkLoadSize(name: string, files: Record<string, Uint8Array>): void {
    // The frontends count them as they read the request (see loadLimits); checked again for other callers.
    const paths = Object.keys(files);
    if (paths.length > this.opts.maxLoadFiles) throw tooManyLoadFiles(name, paths.length, this.opts.maxLoadFiles);
    let bytes = 0;
    for (const path of paths) bytes += (files[path] as Uint8Array).byteLength;
    if (bytes > this.opts.maxLoadBytes) throw tooManyLoadBytes(name, bytes, this.opts.maxLoadBytes);
  }

  /** Why `config` asks more of the server than one model may (see configBoundsProblem). */
  private boundsProblem(config: ModelConfig): string | undefined {
    return configBoundsProblem(config, { maxInstancesPerModel: this.opts.maxInstancesPerModel });
  }

  /**
   * A load request's overrides come from a client: unless the operator allowed unsafe overrides,
   * they may not upload code (a TypeScript stage's model.js would run in the server) nor change
   * the model's `parameters`, which name the code a stage runs, the files it reads and the
   * endpoints it connects to. What else a config says (batching, instances, inputs) stays open.
   */
  private checkOverride(name: string, config: ModelConfig, files: ReadonlyMap<string, string>): void {
    if (this.opts.allowUnsafeLoadOverrides) return;
    const refuse = (why: string) =>
      new StageError(
        Code.PermissionDenied,
        "",
        `failed to load '${name}': ${why}; the server refuses this unless started with --allow-unsafe-load-overrides`,
      );
    const repository = this.models.get(name)?.model?.config;
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

  /** Loads the local (non-remote) steps of an ensemble that are not loaded yet. */
  private async loadSteps(model: RepositoryModel, seen: Set<string>): Promise<void> {
    for (const step of ensembleSteps(model.config)) {
      // Remote steps are reached through --endpoints (see stepStage), not loaded here.
      if (this.opts.endpoints[step.model] || seen.has(step.model)) continue;
      seen.add(step.model);
      const e = this.models.get(step.model);
      if (e && [...e.versions.values()].some((v) => v.state === "READY")) continue;
      if (!e?.model) continue; // the ensemble's own load reports the missing step
      if (isEnsemble(e.model.config)) await this.loadSteps(e.model, seen);
      const stepModel = e.model;
      await this.enqueue(e, () => this.loadEntry(e, stepModel));
    }
  }

  /**
   * Loads the versions the policy selects and unloads the others. A version
   * already READY is kept as it is when nothing it was loaded from changed;
   * when something did, it is reloaded as Triton does: the new stage replaces
   * the old one only once it is ready (requests keep flowing meanwhile, and
   * the old one's in-flight requests finish), and if the reload fails the old
   * one stays loaded. Returns why each selected version failed (versions
   * unloaded because the policy no longer selects them are not failures).
   */
  private async loadEntry(e: ModelEntry, model: RepositoryModel): Promise<string[]> {
    // Before anything loads: a model already loaded stays as it is; one that is not is a failed load.
    const bounds = this.boundsProblem(model.config);
    if (bounds) {
      if (!isLoaded(e)) e.versions.set("", { version: "", state: "UNAVAILABLE", reason: bounds });
      this.opts.logger.error({ model: model.name, reason: bounds }, "model failed to load");
      return [bounds];
    }
    const wanted = selectVersions(model.config, model.versions);
    if (wanted.length === 0) {
      const reason = `no version is available (version folders: [${model.versions.join(", ")}])`;
      e.versions.set("", { version: "", state: "UNAVAILABLE", reason });
      e.loadedFrom = undefined;
      this.opts.logger.error({ model: model.name, state: "UNAVAILABLE", reason }, "model failed to load");
      return [reason];
    }
    e.versions.delete("");
    const source = await sourceOf(model, wanted);
    const changed = e.loadedFrom !== source;
    // Read once, and only if some version is actually (re)loaded.
    let labels: Promise<Map<string, string[]>> | undefined;
    // Versions no longer selected go first (e.g. a newer one appeared under "latest 1").
    for (const v of [...e.versions.values()]) {
      if (!wanted.includes(v.version)) await this.unloadVersion(e, v);
    }
    const failures: string[] = [];
    await Promise.all(
      wanted.map(async (version) => {
        const previous = e.versions.get(version);
        const serving = previous?.state === "READY" && previous.stage ? previous : undefined;
        if (serving && !changed) return;
        const entry: VersionEntry = { version, state: "LOADING", reason: "" };
        if (!serving) e.versions.set(version, entry);
        let stage: Stage | undefined;
        try {
          const shadow = this.shadowFor(model);
          stage = await this.loadReadyStage(model, version);
          labels ??= readLabels(model);
          entry.stage = new ManagedStage(
            stage,
            await labels,
            () => this.readyVersions(model.name),
            await this.cacheFor(model, version),
            shadow,
          );
          entry.state = "READY";
          e.versions.set(version, entry);
          this.opts.logger.info(
            { model: model.name, version, state: "READY" },
            serving ? "model reloaded" : "model loaded",
          );
          if (serving?.stage) await this.retire(model.name, version, serving.stage);
        } catch (err) {
          const reason = err instanceof Error ? err.message : String(err);
          failures.push(`version ${version}: ${reason}`);
          if (serving) {
            this.opts.logger.error(
              { model: model.name, version, state: "READY", reason },
              "model failed to reload: the loaded one stays",
            );
          } else {
            entry.state = "UNAVAILABLE";
            entry.reason = reason;
            this.opts.logger.error(
              { model: model.name, version, state: "UNAVAILABLE", reason },
              "model failed to load",
            );
          }
          // Loaded and ready, but failed after (its labels): release its sessions and workers.
          await stage
            ?.close()
            .catch((closeErr: unknown) =>
              this.opts.logger.warn({ model: model.name, version, err: String(closeErr) }, "error closing model"),
            );
        }
      }),
    );
    // A failed reload is retried by the next load or poll; a failed first load too.
    e.loadedFrom = failures.length === 0 ? source : undefined;
    if (isLoaded(e)) e.steps = ensembleSteps(model.config).map((step) => step.model);
    return failures;
  }

  /** Shadow mode, when the config names a `shadow_model`: the model it names is found at each sample. */
  private shadowFor(model: RepositoryModel): ShadowComparer | undefined {
    const settings = shadowSettings(model.config);
    if (!settings) return undefined;
    return new ShadowComparer(model.name, settings, (name) => this.resolve(name).inner, this.opts.logger);
  }

  /**
   * One version's stage, loaded and ready (warmed up). Loads take a slot of --model-load-thread-count
   * (an ensemble does not: it only wires steps already loaded). A failed try is retried
   * --model-load-retry-count times, each try starting afresh; the last failure is the one reported.
   */
  private async loadReadyStage(model: RepositoryModel, version: string): Promise<Stage> {
    const once = async () => {
      const stage = await this.opts.loader.loadStage(model, {
        version,
        resolveStep: (step, stepVersion) => this.stepStage(step, stepVersion),
        repositories: this.repositories,
        endpoints: this.opts.endpoints,
        strictModelConfig: this.opts.strictModelConfig,
        ...(this.opts.defaultMaxBatchSize !== undefined ? { defaultMaxBatchSize: this.opts.defaultMaxBatchSize } : {}),
        ...(this.opts.rateLimiter ? { rateLimiter: this.opts.rateLimiter } : {}),
        defaultMaxQueueSize: this.opts.defaultMaxQueueSize,
        cpuGate: this.cpuGate,
        models: this.modelCaller,
        ...(this.opts.python ? { python: this.opts.python } : {}),
        logger: this.opts.logger,
      });
      try {
        if (!(await stage.isReady())) await waitReady(stage);
        return stage;
      } catch (err) {
        // Loaded but never ready (warmup failed): release its sessions and workers.
        await stage
          .close()
          .catch((closeErr: unknown) =>
            this.opts.logger.warn({ model: model.name, version, err: String(closeErr) }, "error closing model"),
          );
        throw err;
      }
    };
    const tries = async () => {
      for (let attempt = 0; ; attempt++) {
        try {
          return await once();
        } catch (err) {
          if (attempt >= this.opts.loadRetries) throw err;
          this.opts.logger.warn(
            {
              model: model.name,
              version,
              attempt: attempt + 1,
              reason: err instanceof Error ? err.message : String(err),
            },
            "model failed to load: trying again",
          );
        }
      }
    };
    return isEnsemble(model.config) ? tries() : this.loadSlots(tries);
  }

  /** A replaced stage: it already takes no new requests; it closes once its in-flight ones finish. */
  private async retire(model: string, version: string, stage: ManagedStage): Promise<void> {
    await stage.drained();
    await stage
      .close()
      .catch((err: unknown) => this.opts.logger.warn({ model, version, err: String(err) }, "error closing model"));
  }

  /**
   * The response cache for one load of a model version, if the server has one and the config
   * enables it. In this process's cache each load has entries of its own; in a cache replicas
   * share, a load's entries are those of the same model files, whoever computed them.
   */
  private async cacheFor(model: RepositoryModel, version: string): Promise<ModelCache | undefined> {
    if (!model.config.responseCache?.enable) return undefined;
    const store = this.opts.responseCache;
    if (!store) {
      this.opts.logger.warn(
        { model: model.name, version },
        "response_cache is enabled in the model config, but the server has no response cache (--cache-config local,size=<bytes>): serving uncached",
      );
      return undefined;
    }
    const load = store.shared ? await contentHash(model, version) : String(++this.loads);
    return { store, scope: `${model.name}\u0000${version}\u0000${load}` };
  }

  /**
   * An ensemble's view of one of its steps: every call goes to whatever
   * version is loaded now, so reloading a step does not strand the ensemble.
   */
  private async stepStage(name: string, version: bigint): Promise<Stage> {
    const v = version > 0n ? String(version) : "";
    const url = this.opts.endpoints[name];
    if (url && !this.models.get(name)?.versions.size) {
      // A remote step that this server does not load itself: one connection however often ensembles reload.
      const key = `${name}@${v}`;
      let remote = this.remoteSteps.get(key);
      if (!remote) {
        // Wrapped as every loaded model is, so its requests are stamped on their traces alike. One not
        // answering yet (services start in any order) keeps the ensemble loading, not failed.
        const connect = () => this.opts.loader.connectRemote(name, url, v);
        remote = connectWhenReachable(connect, name, this.opts.logger, this.stopWaiting.signal).then(
          (stage) => new ManagedStage(stage),
        );
        this.remoteSteps.set(key, remote);
        remote.catch(() => this.remoteSteps.delete(key));
      }
      return remote;
    }
    const current = this.resolve(name, v);
    // Each call goes to the version loaded at that moment; what is not overridden is passed on as it is.
    return delegateStage(() => this.resolve(name, v), {
      name,
      get version() {
        return current.version;
      },
      config: current.config,
      isReady: async () => {
        try {
          return await this.resolve(name, v).isReady();
        } catch {
          return false;
        }
      },
      // A decoupled step streams its responses (the ensemble is then decoupled too).
      inferStream: current.inferStream
        ? (request, options) => answersOf(this.resolve(name, v), request, options)
        : undefined,
      // What the ensemble admits at once follows from it (0 while the step is not loaded: it refuses anyway).
      maxQueueSize: () => {
        try {
          return this.resolve(name, v).maxQueueSize();
        } catch {
          return 0;
        }
      },
      // The step is the manager's to close, not the ensemble's.
      close: async () => {},
    });
  }

  /**
   * Unloads `name`; with unloadDependents (Triton's unload_dependents) an ensemble's steps
   * go too, and theirs in turn, except those another loaded model still calls.
   */
  async unload(name: string, options: ModelUnloadOptions = {}): Promise<void> {
    const e = this.models.get(name);
    if (!e) throw new StageError(Code.NotFound, "", `failed to unload '${name}': no such model`);
    await this.enqueue(e, () => this.unloadEntry(e));
    if (options.unloadDependents) await this.unloadUnusedSteps(e.steps, new Set([name]));
  }

  private async unloadUnusedSteps(steps: string[], seen: Set<string>): Promise<void> {
    for (const name of steps) {
      // Remote steps (--endpoints) are another server's models, not this one's to unload.
      if (seen.has(name) || this.opts.endpoints[name]) continue;
      seen.add(name);
      const step = this.models.get(name);
      if (!step || !isLoaded(step) || this.calledByLoadedModel(name)) continue;
      await this.enqueue(step, () => this.unloadEntry(step));
      await this.unloadUnusedSteps(step.steps, seen);
    }
  }

  private calledByLoadedModel(name: string): boolean {
    for (const e of this.models.values()) if (isLoaded(e) && e.steps.includes(name)) return true;
    return false;
  }

  private async unloadEntry(e: ModelEntry): Promise<void> {
    await Promise.all([...e.versions.values()].map((v) => this.unloadVersion(e, v)));
  }

  /** New requests are refused at once; in-flight ones finish before the stage closes. */
  private async unloadVersion(e: ModelEntry, v: VersionEntry): Promise<void> {
    const stage = v.stage;
    if (!stage) {
      // A failed version unloaded is "unloaded", as Triton's: it no longer holds readiness back.
      v.state = "UNAVAILABLE";
      v.reason = "unloaded";
      return;
    }
    v.state = "UNLOADING";
    v.reason = "";
    await stage.drained();
    try {
      await stage.close();
    } catch (err) {
      this.opts.logger.warn({ model: e.name, version: v.version, err: String(err) }, "error closing model");
    }
    v.stage = undefined;
    v.state = "UNAVAILABLE";
    v.reason = "unloaded";
    this.opts.logger.info({ model: e.name, version: v.version, state: "UNAVAILABLE" }, "model unloaded");
  }

  // ---- poll mode ----

  private schedulePoll(): void {
    this.pollTimer = setTimeout(() => {
      this.poll()
        .catch((err) => this.opts.logger.error({ err: String(err) }, "repository poll failed"))
        .finally(() => {
          if (!this.closed) this.schedulePoll();
        });
    }, this.opts.pollIntervalMs);
    this.pollTimer.unref();
  }

  /**
   * Loads new models, unloads removed ones; loading a model that is already
   * READY reloads it only if what it was loaded from changed (see loadEntry).
   */
  async poll(): Promise<void> {
    const scan = await this.scan();
    const present = new Set([...scan.models.map((m) => m.name), ...scan.errors.map((x) => x.name)]);
    for (const e of [...this.models.values()]) {
      if (!present.has(e.name)) {
        await this.enqueue(e, () => this.unloadEntry(e));
        this.models.delete(e.name);
      }
    }
    await this.loadMany([...scan.models, ...scan.errors].map((m) => m.name));
  }
}

/**
 * The model with a load request's JSON config in place of its config.pbtxt,
 * as Triton's load with a "config" parameter: the model's files still come
 * from its folder, and a later load without one goes back to config.pbtxt
 * (the config text differs, so it reloads).
 */
function withConfig(model: RepositoryModel, json: string): RepositoryModel {
  return { ...model, config: configFromJson(model.name, json), configText: `config parameter:\n${json}` };
}

/** The start of Triton's refusal of a load its repository poll could not serve (model_repository_manager.cc). */
const notPolled = (name: string) => `failed to load '${name}', failed to poll from model repository`;

/** `name` from a client's load or unload, refused (INVALID_ARGUMENT) when it cannot name a model. */
function checkedName(name: string, action: string): string {
  const refusal = modelNameRefusal(name, `failed to ${action} ${JSON.stringify(name)}`);
  if (refusal) throw new StageError(Code.InvalidArgument, "", refusal);
  return name;
}

/** A load request's JSON config for model `name` (which it must not rename). */
function configFromJson(name: string, json: string): ModelConfig {
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
 * What a model is loaded from, as one comparable string: its config.pbtxt
 * text, its version folders, and the name, size and modification time of
 * each file in the model folder and in the selected version folders.
 */
async function sourceOf(model: RepositoryModel, versions: string[]): Promise<string> {
  const files = async (dir: string): Promise<string[]> => {
    const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
    return Promise.all(
      entries
        .filter((d) => !d.isDirectory())
        .sort((a, b) => a.name.localeCompare(b.name))
        .map(async (d) => {
          const s = await stat(join(dir, d.name)).catch(() => undefined);
          return `${d.name}:${s?.size}:${s?.mtimeMs}`;
        }),
    );
  };
  const parts = [model.configText, model.versions.join(","), ...(await files(model.modelDir))];
  for (const v of versions) parts.push(`[${v}]`, ...(await files(join(model.modelDir, v))));
  return parts.join("\n");
}

/**
 * What a model version is, for a cache its replicas share: its config and the contents of the
 * files in its folder and its version folder (not their times, which differ between machines).
 */
async function contentHash(model: RepositoryModel, version: string): Promise<string> {
  const hash = createHash("sha256").update(model.configText);
  for (const dir of [model.modelDir, join(model.modelDir, version)]) {
    const entries = await readdir(dir, { withFileTypes: true, recursive: dir !== model.modelDir }).catch(() => []);
    const files = entries
      .filter((d) => d.isFile())
      .map((d) => join(d.parentPath ?? dir, d.name))
      .sort();
    for (const file of files) {
      hash.update(`\u0000${file.slice(model.modelDir.length)}\u0000`);
      for await (const chunk of createReadStream(file)) hash.update(chunk as Buffer);
    }
  }
  return hash.digest("base64");
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

/** Waits for a stage that loaded but is still warming up. */
async function waitReady(stage: Stage, timeoutMs = 600_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await stage.isReady())) {
    if (Date.now() > deadline) throw new Error(`not ready after ${timeoutMs / 1000}s of warmup`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** Labels for outputs that name a `label_filename` (read from the model directory, as Triton does). */
async function readLabels(model: RepositoryModel): Promise<Map<string, string[]>> {
  const labels = new Map<string, string[]>();
  for (const out of model.config.output) {
    if (!out.labelFilename) continue;
    // A path out of the model's folder fails the load; a missing file only costs the labels.
    const path = modelFilePath(model.modelDir, out.labelFilename, `output ${out.name}: label_filename`, model.name);
    try {
      const text = await readFile(path, "utf8");
      labels.set(out.name, text.split(/\r?\n/));
    } catch {
      // Classification still works without labels ("score:index").
    }
  }
  return labels;
}
