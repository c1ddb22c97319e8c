/**
 * How an ensemble reaches its steps: the step's version loaded now when it loads, and per request
 * a hold on the version serving then (or, for a step only reachable through --endpoints, one shared
 * remote model, waited for until it answers), its local steps loaded before it, and with unload_dependents the steps no loaded model still calls.
 */
import type { HeldStep } from "@trellis/ensemble-runner";
import { type Model, tracingInterceptor } from "@trellis/runtime";
import { Code, type Stage, StageError, StatisticsRecorder } from "@trellis/stage";
import { delegateStage } from "@trellis/stage/backend";
import type { ModelLifecycle } from "./lifecycle.js";
import type { ResolvedOptions } from "./manager-options.js";
import { enqueue, ensembleSteps, isEnsemble, isLoaded, type ModelEntry } from "./registry.js";
import { connectWhenReachable } from "./remote-steps.js";
import type { RepositoryModel } from "./scan.js";

/** What the ensemble steps need from the manager that owns them. */
export interface EnsembleStepsDeps {
  /** The manager's models, by name. */
  models: ReadonlyMap<string, ModelEntry>;
  opts: Pick<ResolvedOptions, "endpoints" | "loader" | "logger">;
  /** The manager's ready version of a model. */
  resolve(name: string, version?: string): Model;
  /** Loads and unloads the steps' versions. */
  lifecycle: Pick<ModelLifecycle, "loadEntry" | "unloadEntry">;
}

/** The manager's ensembles' steps: reached, loaded and unloaded. */
export class EnsembleSteps {
  private readonly models: ReadonlyMap<string, ModelEntry>;
  private readonly opts: EnsembleStepsDeps["opts"];
  private readonly resolve: EnsembleStepsDeps["resolve"];
  private readonly lifecycle: EnsembleStepsDeps["lifecycle"];
  /** Remote ensemble steps by "name@version", shared by every ensemble (and reload) that uses them. */
  private readonly remoteSteps = new Map<string, Promise<Stage>>();
  /** Those connected, for the requests' holds. */
  private readonly connectedRemotes = new Map<string, Stage>();
  /** Aborted at close: remote steps not answering yet are no longer waited for. */
  private readonly stopWaiting = new AbortController();

  constructor(deps: EnsembleStepsDeps) {
    this.models = deps.models;
    this.opts = deps.opts;
    this.resolve = deps.resolve;
    this.lifecycle = deps.lifecycle;
  }

  /** Remote steps not answering yet are no longer waited for (at close, before the unloads). */
  stopWaitingForRemotes(): void {
    this.stopWaiting.abort();
  }

  /** Closes the remote steps (at close, once every model is unloaded). */
  async closeRemoteSteps(): Promise<void> {
    await Promise.allSettled([...this.remoteSteps.values()].map(async (s) => (await s).close()));
  }

  /**
   * A step's model when an ensemble loads (its config and metadata are checked against the
   * ensemble's): the version loaded now, or for a step only reachable through --endpoints, the one
   * shared remote model, waited for until it answers. Its requests take the step's model per
   * request (holdStep), so a reload never strands the ensemble.
   */
  async stepStage(name: string, version: bigint): Promise<Stage> {
    const v = version > 0n ? String(version) : "";
    if (this.isRemote(name)) return this.remoteStep(name, v);
    return this.resolve(name, v);
  }

  /**
   * One ensemble request's hold on a step's model: the version serving now, looked up once and
   * kept loaded until the request ends (Triton's model handle). Throws when none is available.
   */
  holdStep(name: string, version: bigint): HeldStep {
    const v = version > 0n ? String(version) : "";
    if (this.isRemote(name)) {
      // Another server's model: its lifetime is this manager's, not a request's to hold.
      const stage = this.connectedRemotes.get(`${name}@${v}`);
      if (!stage) throw new StageError(Code.Unavailable, "", `remote model '${name}' is not connected`);
      return { stage, release: keep };
    }
    const model = this.resolve(name, v);
    return { stage: model, release: model.hold() };
  }

  /** A step this server does not load itself, reached through --endpoints. */
  private isRemote(name: string): boolean {
    return this.opts.endpoints[name] !== undefined && !this.models.get(name)?.versions.size;
  }

  /** The shared remote model of a step: one connection however often ensembles reload. */
  private remoteStep(name: string, v: string): Promise<Stage> {
    const key = `${name}@${v}`;
    let remote = this.remoteSteps.get(key);
    if (!remote) {
      const url = this.opts.endpoints[name] as string;
      // Served as every loaded model is, so its requests are stamped on their traces alike. One not
      // answering yet (services start in any order) keeps the ensemble loading, not failed.
      const connect = () => this.opts.loader.connectRemote(name, url, v);
      remote = connectWhenReachable(connect, name, this.opts.logger, this.stopWaiting.signal).then((stage) => {
        const traced = tracedRemote(stage);
        this.connectedRemotes.set(key, traced);
        return traced;
      });
      this.remoteSteps.set(key, remote);
      remote.catch(() => this.remoteSteps.delete(key));
    }
    return remote;
  }

  /**
   * Unloads `name`; with unloadDependents (Triton's unload_dependents) an ensemble's steps
   * go too, and theirs in turn, except those another loaded model still calls.

  /** Loads the local (non-remote) steps of an ensemble that are not loaded yet. */
  async loadSteps(model: RepositoryModel, seen: Set<string>): Promise<void> {
    for (const step of ensembleSteps(model.config)) {
      // Remote steps are reached through --endpoints (see stepStage), not loaded here.
      if (this.opts.endpoints[step.model] || seen.has(step.model)) continue;
      seen.add(step.model);
      const e = this.models.get(step.model);
      if (e && [...e.versions.values()].some((v) => v.state === "READY")) continue;
      if (!e?.model) continue; // the ensemble's own load reports the missing step
      if (isEnsemble(e.model.config)) await this.loadSteps(e.model, seen);
      const stepModel = e.model;
      await enqueue(e, () => this.lifecycle.loadEntry(e, stepModel));
    }
  }

  async unloadUnusedSteps(steps: string[], seen: Set<string>): Promise<void> {
    for (const name of steps) {
      // Remote steps (--endpoints) are another server's models, not this one's to unload.
      if (seen.has(name) || this.opts.endpoints[name]) continue;
      seen.add(name);
      const step = this.models.get(name);
      if (!step || !isLoaded(step) || this.calledByLoadedModel(name)) continue;
      await enqueue(step, () => this.lifecycle.unloadEntry(step));
      await this.unloadUnusedSteps(step.steps, seen);
    }
  }

  private calledByLoadedModel(name: string): boolean {
    for (const e of this.models.values()) if (isLoaded(e) && e.steps.includes(name)) return true;
    return false;
  }
}

const keep = () => {};

/**
 * A remote model as a step: its server checks, queues and computes, and sends its own trace
 * back; here only the request's start and end are stamped on the caller's trace.
 */
function tracedRemote(stage: Stage): Stage {
  const model = { ...stage, recorder: new StatisticsRecorder(stage.name, stage.version, false) };
  const infer = tracingInterceptor.infer?.((r, o) => stage.infer(r, o), model);
  const stream = stage.inferStream?.bind(stage);
  return delegateStage(stage, {
    ...(infer ? { infer } : {}),
    ...(stream ? { inferStream: tracingInterceptor.inferStream?.(stream, model) } : {}),
  });
}
