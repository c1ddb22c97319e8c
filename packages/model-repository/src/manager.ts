/**
 * The model repository manager: scans Triton-layout repositories, loads the
 * versions each model's version policy selects, tracks per-version state
 * (READY / UNAVAILABLE / LOADING / UNLOADING) and serves them as a
 * ModelRegistry to both frontends.
 */
import type {
  HeldModel,
  ModelIndexEntry,
  ModelLoadOptions,
  ModelRegistry,
  ModelRepositoryControl,
  ModelUnloadOptions,
} from "@trellis/kserve";
import type { Model } from "@trellis/runtime";
import { Code, StageError } from "@trellis/stage";
import { EnsembleSteps } from "./ensemble-steps.js";
import { ModelLifecycle } from "./lifecycle.js";
import { checkedName, checkOverride, loadFromFiles, notPolled, withConfig } from "./load-overrides.js";
import {
  type ControlMode,
  type RepositoryManagerOptions,
  type ResolvedOptions,
  withDefaults,
} from "./manager-options.js";
import { byVersion, enqueue, isEnsemble, type ModelEntry } from "./registry.js";
import type { RepositoryScan, RepositorySource } from "./scan.js";

export class RepositoryManager implements ModelRegistry {
  private readonly models = new Map<string, ModelEntry>();
  private readonly opts: ResolvedOptions;
  private started = false;
  private closed = false;
  /** Set when shutdown begins: the server stops reporting ready at once, as Triton does. */
  private draining = false;
  private pollTimer?: NodeJS.Timeout;
  /** The repositories scanned: the command line's, then those registered at run time. */
  private readonly repositories: RepositorySource[];
  readonly repository: ModelRepositoryControl;
  /** Loads and unloads the models' versions. */
  private readonly lifecycle: ModelLifecycle;
  /** How ensembles reach, load and unload their steps. */
  private readonly steps: EnsembleSteps;

  constructor(options: RepositoryManagerOptions) {
    this.opts = withDefaults(options);
    this.repositories = options.repositories.map((path) => ({ path }));
    this.lifecycle = new ModelLifecycle({
      opts: this.opts,
      loadConcurrency: options.loadConcurrency ?? 4,
      repositories: this.repositories,
      resolve: (name, version) => this.resolve(name, version),
      readyVersions: (name) => this.readyVersions(name),
      stepStage: (name, version) => this.steps.stepStage(name, version),
      holdStep: (name, version) => this.steps.holdStep(name, version),
    });
    this.steps = new EnsembleSteps({
      models: this.models,
      opts: this.opts,
      resolve: (name, version) => this.resolve(name, version),
      lifecycle: this.lifecycle,
    });
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
    this.steps.stopWaitingForRemotes();
    // Ensembles first: they may still be calling their steps.
    const entries = [...this.models.values()].sort(
      (a, b) => Number(b.model ? isEnsemble(b.model.config) : 0) - Number(a.model ? isEnsemble(a.model.config) : 0),
    );
    for (const e of entries) await enqueue(e, () => this.lifecycle.unloadEntry(e));
    await this.steps.closeRemoteSteps();
  }

  // ---- ModelRegistry ----

  /**
   * The version resolve gives, reserved for one request not yet running (Model.reserve): an
   * unload or reload waits for it; its `infer` then counts it in flight.
   */
  acquire(name: string, version?: string): HeldModel {
    const model = this.resolve(name, version);
    return { stage: model, release: model.reserve() };
  }

  resolve(name: string, version?: string): Model {
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

  list(): Model[] {
    const out: Model[] = [];
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
      await enqueue(e, () => this.lifecycle.unloadEntry(e));
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
    if (options.files && Object.keys(options.files).length > 0) return this.loadFiles(name, options);
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
    if (configOverride !== undefined)
      checkOverride(name, model.config, new Map(), this.opts.allowUnsafeLoadOverrides, e.model.config);
    if (isEnsemble(model.config)) await this.steps.loadSteps(model, new Set([name, ...(tried ?? [])]));
    const failures = await enqueue(e, () => this.lifecycle.loadEntry(e, model));
    if (failures.length > 0) {
      throw new StageError(Code.InvalidArgument, "", `failed to load '${name}': ${failures.join("; ")}`);
    }
  }

  /** A load with file overrides (see loadFromFiles): the model made of the request's files, its steps first. */
  private loadFiles(name: string, options: ModelLoadOptions): Promise<void> {
    return loadFromFiles(name, options, {
      opts: this.opts,
      repositoryConfig: this.models.get(name)?.model?.config,
      boundsProblem: (config) => this.lifecycle.boundsProblem(config),
      nextLoad: () => this.lifecycle.nextLoad(),
      load: async (model) => {
        const e = this.entry(name);
        if (isEnsemble(model.config)) await this.steps.loadSteps(model, new Set([name]));
        return enqueue(e, () => this.lifecycle.loadEntry(e, model));
      },
    });
  }

  /**
   * Unloads `name`; with unloadDependents (Triton's unload_dependents) an ensemble's steps
   * go too, and theirs in turn, except those another loaded model still calls.
   */
  async unload(name: string, options: ModelUnloadOptions = {}): Promise<void> {
    const e = this.models.get(name);
    if (!e) throw new StageError(Code.NotFound, "", `failed to unload '${name}': no such model`);
    await enqueue(e, () => this.lifecycle.unloadEntry(e));
    if (options.unloadDependents) await this.steps.unloadUnusedSteps(e.steps, new Set([name]));
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
        await enqueue(e, () => this.lifecycle.unloadEntry(e));
        this.models.delete(e.name);
      }
    }
    await this.loadMany([...scan.models, ...scan.errors].map((m) => m.name));
  }
}
