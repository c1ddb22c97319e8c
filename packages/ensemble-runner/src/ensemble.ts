/**
 * The ensemble as a Stage: each request walks the validated DAG, starting a
 * step the moment its last input exists, so independent steps overlap.
 * Load-time checks are here; a request's run is in runner.ts (DAG execution in
 * dag.ts, decoupled fan-out in decoupled.ts, admission in admission.ts, per-step
 * statistics in steps.ts).
 */

import type { ModelConfig, ModelStatistics } from "@trellis/protocol";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  isDecoupled,
  type Stage,
  StageError,
  type StageLogger,
  type Tensor,
} from "@trellis/stage";
import { decoupledRefusal } from "@trellis/stage/backend";
import { stepError } from "./errors.js";
import type { HoldStep } from "./held-steps.js";
import { type EnsemblePlan, ensembling, planEnsemble } from "./plan.js";
import { EnsembleRunner, type EnsembleRunnerOptions, type Served } from "./runner.js";
import { type EnsembleTimes, type StepStatistics, stepStatistics } from "./steps.js";

export { EnsembleStepError } from "./errors.js";
export type { HeldStep, HoldStep } from "./held-steps.js";
export type { EnsembleTimes, StepStatistics } from "./steps.js";

export type ResolveStep = (model: string, version: bigint) => Stage | Promise<Stage>;

export interface CreateEnsembleOptions {
  config: ModelConfig;
  /** Version this ensemble serves as; default "1". */
  version?: string;
  /** Turns a step's model_name / model_version (-1 = latest) into a Stage. */
  resolveStep: ResolveStep;
  logger?: StageLogger;
  /** Close the step stages when the ensemble closes (set when the ensemble created them). Default false. */
  ownsSteps?: boolean;
  /**
   * How each request takes its steps' models, once, for its whole run (a repository whose models
   * may be reloaded: see HoldStep). Without it every request runs on the stages resolveStep gave.
   */
  holdStep?: HoldStep;
}

export interface EnsembleStage extends Stage {
  statistics(): ModelStatistics;
  /** The most requests to admit at once (0: unbounded): its tightest step's queue bound. */
  maxQueueSize(): number;
  /** That bound, and the step that sets it, for a refusal's words (the model runtime admits by it). */
  queueBound(): { bound: number; what: string };
  /**
   * One request's answer for a model runtime serving the ensemble: not recorded here (the
   * runtime records it), with the time its steps spent queued and computing.
   */
  inferWithTimes(request: InferRequest, options?: InferOptions): Promise<{ outputs: Tensor[]; times: EnsembleTimes }>;
  /**
   * @deprecated renamed `inferWithTimes` (the same function): `execute` means answering each
   * request of a batch, as Triton's `execute(requests)`.
   */
  execute(request: InferRequest, options?: InferOptions): Promise<{ outputs: Tensor[]; times: EnsembleTimes }>;
  /** A decoupled ensemble's responses for a model runtime serving it (not recorded here). */
  executeStream(request: InferRequest, options?: InferOptions): AsyncIterable<InferResponse>;
  stepStatistics(): StepStatistics[];
  /** The DAG: each step's model, what it waits for and a topological order. */
  readonly plan: EnsemblePlan;
}

/** Served by a model runtime that records the request itself: the steps' times are not wanted. */
const ignoreTimes: Served = () => {};

/** A coupled ensemble's one answer to a request, served (not recorded here), with its steps' times. */
async function answerWithTimes(runner: EnsembleRunner, request: InferRequest, options?: InferOptions) {
  let times: EnsembleTimes = { queueNs: 0, computeInputNs: 0, computeInferNs: 0, computeOutputNs: 0 };
  let answer: InferResponse | undefined;
  for await (const response of runner.answers(request, options, (t) => {
    times = t;
  }))
    answer = response;
  return { outputs: answer!.outputs, times };
}

export async function createEnsemble(options: CreateEnsembleOptions): Promise<EnsembleStage> {
  const { config, logger } = options;
  const name = config.name;
  const version = options.version ?? "1";
  const spec = ensembling(config);

  // Steps load concurrently (an ONNX session and an image stage need not wait for each other).
  const settled = await Promise.allSettled(
    spec.step.map(async (s) => options.resolveStep(s.modelName, s.modelVersion)),
  );
  const stages = settled.flatMap((r) => (r.status === "fulfilled" ? [r.value] : []));
  try {
    const failed = settled.findIndex((r) => r.status === "rejected");
    if (failed >= 0) {
      const reason = (settled[failed] as PromiseRejectedResult).reason;
      throw stepError(name, { index: failed, model: spec.step[failed]!.modelName }, reason);
    }
    // A decoupled step (any number of responses per request) makes the ensemble decoupled, as in Triton.
    const decoupledSteps = stages.flatMap((s, i) => (isDecoupled(s.config) || s.inferStream !== undefined ? [i] : []));
    if (decoupledSteps.length > 1) {
      const which = decoupledSteps.map((i) => `step ${i} (${spec.step[i]!.modelName})`).join(", ");
      throw new StageError(
        Code.InvalidArgument,
        name,
        `at most one step may be a decoupled model; ${which} are decoupled`,
      );
    }
    const decoupledStep = decoupledSteps[0] ?? -1;
    if ((decoupledStep >= 0 || isDecoupled(config)) && config.responseCache?.enable) {
      throw new StageError(
        Code.InvalidArgument,
        name,
        "the response cache does not support decoupled models (this ensemble is decoupled: it streams its answers)",
      );
    }
    const metas = await Promise.all(stages.map((s) => s.metadata()));
    const plan = planEnsemble(config, stages, metas);
    return buildEnsemble({
      config,
      version,
      plan,
      maxInflight: spec.maxInflightRequests,
      ownsSteps: options.ownsSteps ?? false,
      logger,
      decoupledStep,
      versions: spec.step.map((s) => s.modelVersion),
      ...(options.holdStep ? { holdStep: options.holdStep } : {}),
    });
  } catch (err) {
    if (options.ownsSteps) await Promise.allSettled([...new Set(stages)].map((s) => s.close()));
    throw err;
  }
}

interface BuildEnsembleOptions extends EnsembleRunnerOptions {
  /** Close the step stages when the ensemble closes. */
  ownsSteps: boolean;
  logger: StageLogger | undefined;
}

/** Whether every step's model is ready now (looked up as a request would; false when one is not loaded). */
async function stepsReady(runner: EnsembleRunner): Promise<boolean> {
  let steps: ReturnType<EnsembleRunner["holder"]["take"]>;
  try {
    steps = runner.holder.take();
  } catch {
    return false;
  }
  try {
    return (await Promise.all(steps.stages.map((s) => s.isReady()))).every(Boolean);
  } finally {
    steps.release();
  }
}

/** The Stage over a validated plan: its requests are the runner's. */
function buildEnsemble(options: BuildEnsembleOptions): EnsembleStage {
  const { plan, ownsSteps, logger } = options;
  const runner = new EnsembleRunner(options);
  const { name, version, config, metadata, decoupled } = runner;
  for (const input of metadata.inputs) {
    if (!plan.consumers.has(input.name))
      logger?.warn({ ensemble: name, input: input.name }, "ensemble input is unused");
  }
  // One bound method for every entry point: no wrapper between a request and the runner.
  const answers = runner.answers.bind(runner);
  const inferWithTimes = (request: InferRequest, options?: InferOptions) => answerWithTimes(runner, request, options);
  const stage: EnsembleStage = {
    name,
    version,
    config,
    plan,
    isReady: () => !runner.closed && stepsReady(runner),
    metadata: () => metadata,
    async infer(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
      // A decoupled ensemble answers over a stream (inferStream), as Triton's.
      if (decoupled) throw decoupledRefusal(name);
      let answer: InferResponse | undefined;
      for await (const response of answers(request, options)) answer = response;
      return answer!;
    },
    statistics: () => runner.recorder.snapshot(),
    maxQueueSize: () => runner.entryBound.get().bound,
    queueBound: () => runner.entryBound.described(),
    inferWithTimes,
    execute: inferWithTimes,
    executeStream: (request: InferRequest, options?: InferOptions) => answers(request, options, ignoreTimes),
    ...(decoupled ? { inferStream: answers } : {}),
    stepStatistics: () => stepStatistics(runner.steps),
    async close() {
      runner.closed = true;
      if (ownsSteps) await Promise.allSettled([...new Set(plan.steps.map((s) => s.stage))].map((s) => s.close()));
    },
  };
  return stage;
}
