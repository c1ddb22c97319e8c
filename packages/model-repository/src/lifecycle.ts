/**
 * Loading and unloading one model's versions: the versions its policy selects loaded (each with
 * retries, under the load slots, warmed up, with its labels, cache and shadow), a reloaded version
 * replacing the old one once ready, and versions unloaded once their in-flight requests finish.
 */
import { createHash } from "node:crypto";
import { createReadStream } from "node:fs";
import { readdir, readFile, stat } from "node:fs/promises";
import { join } from "node:path";
import type { HoldStep } from "@trellis/ensemble-runner";
import { createModelCaller } from "@trellis/kserve";
import type { ModelConfig } from "@trellis/protocol";
import {
  CpuGate,
  cacheInterceptor,
  classificationInterceptor,
  createModel,
  Model,
  type ModelCache,
  type ModelInterceptor,
  tracingInterceptor,
} from "@trellis/runtime";
import type { Stage } from "@trellis/stage";
import { modelFilePath } from "@trellis/stage/backend";
import pLimit, { type LimitFunction } from "p-limit";
import { configBoundsProblem } from "./config-bounds.js";
import { remoteBackend } from "./loader.js";
import type { ResolvedOptions } from "./manager-options.js";
import { ensembleSteps, isEnsemble, isLoaded, type ModelEntry, selectVersions, type VersionEntry } from "./registry.js";
import type { RepositoryModel, RepositorySource } from "./scan.js";
import { ShadowComparer, shadowInterceptor, shadowSettings } from "./shadow.js";

/** What the lifecycle needs from the manager that owns it. */
export interface LifecycleDeps {
  opts: ResolvedOptions;
  /** How many models (or versions) load at once (--model-load-thread-count). */
  loadConcurrency: number;
  /** The repositories scanned (an ensemble's steps are looked for there). */
  repositories: RepositorySource[];
  /** The manager's ready version of a model (what the shadow and a stage's calls to other models reach). */
  resolve(name: string, version?: string): Model;
  /** The manager's READY versions of a model, ascending. */
  readyVersions(name: string): string[];
  /** How an ensemble reaches its steps at load (see EnsembleSteps.stepStage). */
  stepStage(name: string, version: bigint): Promise<Stage>;
  /** How each of an ensemble's requests takes its steps' models (see EnsembleSteps.holdStep). */
  holdStep: HoldStep;
}

/** Loads and unloads the versions of the manager's models. */
export class ModelLifecycle {
  private readonly opts: ResolvedOptions;
  private readonly repositories: RepositorySource[];
  private readonly resolve: LifecycleDeps["resolve"];
  private readonly readyVersions: LifecycleDeps["readyVersions"];
  private readonly stepStage: LifecycleDeps["stepStage"];
  private readonly holdStep: HoldStep;
  /** The process's CPU, shared by every model this manager loads: ONNX runs with exclusive_cpu against image decodes. */
  private readonly cpuGate = new CpuGate();
  /** Counts loads, so each load's cache entries are its own (a reload never answers from the old one's). */
  private loads = 0;
  /** What stage factories get as `models`: a TypeScript stage's calls to other models (Triton's BLS) resolve here. */
  private readonly modelCaller = createModelCaller((name, version) => this.resolve(name, version));
  /** Bounds the model loads under way (--model-load-thread-count). */
  private readonly loadSlots: LimitFunction;

  constructor(deps: LifecycleDeps) {
    this.opts = deps.opts;
    this.repositories = deps.repositories;
    this.resolve = deps.resolve;
    this.readyVersions = deps.readyVersions;
    this.stepStage = deps.stepStage;
    this.holdStep = deps.holdStep;
    this.loadSlots = pLimit(deps.loadConcurrency);
  }

  /** The next load's number (each load's cache entries, and each load with files, are its own). */
  nextLoad(): number {
    return ++this.loads;
  }

  /** Why `config` asks more of the server than one model may (see configBoundsProblem). */
  boundsProblem(config: ModelConfig): string | undefined {
    return configBoundsProblem(config, { maxInstancesPerModel: this.opts.maxInstancesPerModel });
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
  async loadEntry(e: ModelEntry, model: RepositoryModel): Promise<string[]> {
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
    const failures: string[] = [];
    await Promise.all(
      wanted.map(async (version) => {
        const previous = e.versions.get(version);
        const serving = previous?.state === "READY" && previous.stage ? previous : undefined;
        if (serving && !changed) return;
        const entry: VersionEntry = { version, state: "LOADING", reason: "" };
        if (!serving) e.versions.set(version, entry);
        let stage: Model | undefined;
        try {
          labels ??= readLabels(model);
          const interceptors = await this.interceptorsFor(model, version, await labels);
          stage = await this.loadReadyStage(model, version, interceptors);
          entry.stage = stage;
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
    // Versions no longer selected go once the selected ones are served (e.g. a newer one appeared
    // under "latest 1"): requests keep being answered meanwhile, and those on an old one finish on it.
    for (const v of [...e.versions.values()]) {
      if (!wanted.includes(v.version)) await this.unloadVersion(e, v);
    }
    // A failed reload is retried by the next load or poll; a failed first load too.
    e.loadedFrom = failures.length === 0 ? source : undefined;
    if (isLoaded(e)) e.steps = ensembleSteps(model.config).map((step) => step.model);
    return failures;
  }

  /**
   * A version's cross-cutting features, in order: tracing (outermost: a request's start and end),
   * the response cache (before the queue), classification, and shadow mode when the config names a
   * `shadow_model` (the model it names is found at each sample).
   */
  private async interceptorsFor(
    model: RepositoryModel,
    version: string,
    labels: Map<string, string[]>,
  ): Promise<ModelInterceptor[]> {
    const chain: ModelInterceptor[] = [tracingInterceptor];
    const cache = await this.cacheFor(model, version);
    if (cache) chain.push(cacheInterceptor(cache));
    chain.push(classificationInterceptor(labels));
    const settings = shadowSettings(model.config);
    if (settings) {
      const comparer = new ShadowComparer(model.name, settings, (name) => this.resolve(name), this.opts.logger);
      chain.push(shadowInterceptor(comparer));
    }
    return chain;
  }

  /**
   * One version's stage, loaded and ready (warmed up). Loads take a slot of --model-load-thread-count
   * (an ensemble does not: it only wires steps already loaded). A failed try is retried
   * --model-load-retry-count times, each try starting afresh; the last failure is the one reported.
   */
  private async loadReadyStage(
    model: RepositoryModel,
    version: string,
    interceptors: readonly ModelInterceptor[],
  ): Promise<Model> {
    const versions = () => this.readyVersions(model.name);
    const once = async () => {
      const loaded = await this.opts.loader.loadStage(model, {
        version,
        interceptors,
        versions,
        resolveStep: (step, stepVersion) => this.stepStage(step, stepVersion),
        holdStep: this.holdStep,
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
      const stage = await asModel(loaded, interceptors, versions);
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
  private async retire(model: string, version: string, stage: Model): Promise<void> {
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
    const load = store.shared ? await contentHash(model, version) : String(this.nextLoad());
    return { store, scope: `${model.name}\u0000${version}\u0000${load}` };
  }

  /**
   * An ensemble's view of one of its steps: every call goes to whatever
   * version is loaded now, so reloading a step does not strand the ensemble.
   */

  async unloadEntry(e: ModelEntry): Promise<void> {
    await Promise.all([...e.versions.values()].map((v) => this.unloadVersion(e, v)));
  }

  /** New requests are refused at once; in-flight ones finish before the stage closes. */
  async unloadVersion(e: ModelEntry, v: VersionEntry): Promise<void> {
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

/**
 * What a loader gave, as the Model the manager holds: our loader's is one already (its
 * interceptors in place); another loader's Stage is served as a remote model is (it checks and
 * computes its requests itself), with the interceptors around it.
 */
async function asModel(
  stage: Stage,
  interceptors: readonly ModelInterceptor[],
  versions: () => string[],
): Promise<Model> {
  if (stage instanceof Model) return stage;
  return createModel({
    config: stage.config,
    version: stage.version,
    backend: remoteBackend(stage),
    interceptors,
    versions,
  });
}
