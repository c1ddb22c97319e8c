/**
 * One request's hold on its steps' models, as Triton's ensemble takes each step's model handle
 * once per request: each model the steps call is looked up once when the request begins and kept
 * loaded until it ends, so a step reloaded or unloaded meanwhile never splits a request between
 * two versions (the request finishes on the one it began with; a later one gets the new one).
 */
import type { Stage } from "@trellis/stage";
import { stepError } from "./errors.js";
import type { EnsemblePlan } from "./plan.js";

/** A request's handle on a step's model: the version serving when it was taken, kept loaded until released. */
export interface HeldStep {
  stage: Stage;
  release(): void;
}

/**
 * Takes a request's handle on a step's model (model_version -1: the latest ready). Throws (a
 * StageError naming why) when the model is not available.
 */
export type HoldStep = (model: string, version: bigint) => HeldStep;

/** The stages one request runs its steps on (by step index), and how it lets them go. */
export interface StepSet {
  stages: readonly Stage[];
  release(): void;
}

const keep = () => {};

export class StepHolder {
  /** Without a HoldStep: the stages the ensemble was made with, for every request. */
  private readonly fixed: StepSet;
  /** The stages the latest request held: what the ensemble's queue bound and readiness read. */
  private latestStages: readonly Stage[];

  constructor(
    private readonly ensemble: string,
    private readonly plan: EnsemblePlan,
    /** Each step's model_version. */
    private readonly versions: readonly bigint[],
    private readonly holdStep?: HoldStep,
  ) {
    this.fixed = { stages: plan.steps.map((s) => s.stage), release: keep };
    this.latestStages = this.fixed.stages;
  }

  /** The stages the latest request held (at first, those the ensemble was made with). */
  get latest(): readonly Stage[] {
    return this.latestStages;
  }

  /**
   * One request's steps: each distinct (model, version) held once, however many steps call it.
   * A model not available refuses the request, naming the first step that calls it.
   */
  take(): StepSet {
    if (!this.holdStep) return this.fixed;
    const byModel = new Map<string, HeldStep>();
    const stages: Stage[] = [];
    try {
      for (const step of this.plan.steps) {
        const version = this.versions[step.index] ?? -1n;
        const key = `${step.model}\u0000${version}`;
        let held = byModel.get(key);
        if (!held) {
          try {
            held = this.holdStep(step.model, version);
          } catch (err) {
            throw stepError(this.ensemble, step, err);
          }
          byModel.set(key, held);
        }
        stages.push(held.stage);
      }
    } catch (err) {
      for (const held of byModel.values()) held.release();
      throw err;
    }
    this.latestStages = stages;
    return {
      stages,
      release: () => {
        for (const held of byModel.values()) held.release();
      },
    };
  }
}
