/**
 * How an ensemble reaches its steps: a view of the step's version loaded now (or, for a step only
 * reachable through --endpoints, one shared remote connection, waited for until it answers), its
 * local steps loaded before it, and with unload_dependents the steps no loaded model still calls.
 */
import type { Stage } from "@trellis/stage";
import { answersOf, delegateStage } from "@trellis/stage/backend";
import type { ModelLifecycle } from "./lifecycle.js";
import { ManagedStage } from "./managed-model.js";
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
  resolve(name: string, version?: string): ManagedStage;
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
   * An ensemble's view of one of its steps: every call goes to whatever
   * version is loaded now, so reloading a step does not strand the ensemble.
   */
  async stepStage(name: string, version: bigint): Promise<Stage> {
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
