/**
 * Per-step runtime state and statistics: each step's slot limiter and recorder, the request a
 * step is sent, and what a step's call adds to the request's and the step's figures.
 */
import type { ModelStatistics } from "@trellis/protocol";
import {
  type InferOptions,
  type InferRequest,
  nowNs,
  type RequestedOutput,
  type Stage,
  StatisticsRecorder,
  type Tensor,
} from "@trellis/stage";
import { inputDims, reshapedFor } from "./batch-shapes.js";
import { Limiter } from "./limiter.js";
import type { EnsemblePlan, StepPlan } from "./plan.js";

export interface StepStatistics {
  step: number;
  model: string;
  /** The version of the step's model these figures are of (a step reloaded meanwhile has one entry per version). */
  version: string;
  /** Requests holding this step's slot now (running, or finished and waiting for a downstream slot). */
  inflight: number;
  /** Requests waiting for a slot now (only when max_inflight_requests caps the step). */
  waiting: number;
  /** This step's share of the ensemble's traffic, in Triton's shape: queue = waiting for a slot, compute_infer = the call. */
  statistics: ModelStatistics;
}

/** What one request spent in the ensemble's steps: their queues and their computing (Triton sums its steps'). */
export interface EnsembleTimes {
  queueNs: number;
  computeInputNs: number;
  computeInferNs: number;
  computeOutputNs: number;
}

export interface StepRuntime {
  plan: StepPlan;
  limiter: Limiter;
  /** The step's share of the traffic, per version of its model that ran it. */
  recorders: Map<string, StatisticsRecorder>;
}

/** The recorder of `rt`'s calls that ran on `version` of its model. */
export function stepRecorder(rt: StepRuntime, version: string): StatisticsRecorder {
  let recorder = rt.recorders.get(version);
  if (!recorder) {
    recorder = new StatisticsRecorder(rt.plan.model, version, false);
    rt.recorders.set(version, recorder);
  }
  return recorder;
}

/** One request's time in its steps so far: waiting for slots, and in the calls. */
export interface StepTotals {
  queueNs: number;
  computeNs: number;
}

/** Each step's runtime: a slot limiter of `maxInflight` (0: unbounded) and its own statistics. */
export function stepRuntimes(plan: EnsemblePlan, maxInflight: number): StepRuntime[] {
  return plan.steps.map((p) => ({
    plan: p,
    limiter: new Limiter(maxInflight),
    recorders: new Map([[p.stage.version, new StatisticsRecorder(p.model, p.stage.version, false)]]),
  }));
}

export const renamed = (t: Tensor, name: string): Tensor =>
  // Zero-copy: the step sees the producer's very data (and shape), under its own name.
  t.name === name ? t : { name, datatype: t.datatype, shape: t.shape, data: t.data };

/**
 * The request `step` is sent (to `stage`, its model for this request): its inputs from the
 * request's tensors so far, under the step's names, each shaped for whether the model batches
 * (batchOf: the batch size of the request that made each tensor; see batch-shapes.ts).
 */
export function stepRequest(
  step: StepPlan,
  stage: Stage,
  tensors: Map<string, Tensor>,
  request: InferRequest,
  perStep: RequestedOutput[][],
  batchOf: WeakMap<Tensor, number>,
): InferRequest {
  const inputs: Tensor[] = [];
  const batching = stage.config.maxBatchSize > 0;
  for (const { name: input, tensor } of step.inputs) {
    const t = tensors.get(tensor);
    // Absent only when it is an optional ensemble input the client left out.
    if (!t) continue;
    inputs.push(reshapedFor(renamed(t, input), inputDims(stage.config, input), batching, batchOf.get(t) ?? 0));
  }
  return { id: request.id, inputs, outputs: perStep[step.index], parameters: request.parameters };
}

/** The batch size a step's request has, for the tensors it answers with (0: its model does not batch). */
export function requestBatch(stage: Stage, request: InferRequest): number {
  return stage.config.maxBatchSize > 0 ? (request.inputs[0]?.shape[0] ?? 0) : 0;
}

/**
 * The options `step`'s call runs under: the request's signal, priority, timeout and a child
 * trace naming the version of the step's model that runs it.
 */
export function stepOptions(
  step: StepPlan,
  version: string,
  signal: AbortSignal,
  options: InferOptions | undefined,
): InferOptions {
  return {
    signal,
    priority: options?.priority,
    timeoutMicroseconds: options?.timeoutMicroseconds,
    trace: options?.trace?.child(step.model, version),
  };
}

/** A step call that succeeded: its statistics, and its share of the request's queue and compute time. */
export function stepSucceeded(
  stats: StatisticsRecorder,
  batch: number,
  queued: number,
  started: number,
  totals: StepTotals,
): void {
  const done = nowNs();
  const times = { computeInputNs: 0, computeInferNs: done - started, computeOutputNs: 0 };
  stats.requestSucceeded(done - queued, batch, started - queued, times);
  stats.executed(batch, times);
  totals.queueNs += started - queued;
  totals.computeNs += done - started;
}

/** Each step's share of the traffic: one entry per version of its model that ran it, by step, then version. */
export function stepStatistics(steps: StepRuntime[]): StepStatistics[] {
  return steps.flatMap((rt) =>
    [...rt.recorders.values()].map((recorder) => ({
      step: rt.plan.index,
      model: rt.plan.model,
      version: recorder.version,
      inflight: rt.limiter.inflight,
      waiting: rt.limiter.waiting,
      statistics: recorder.snapshot(),
    })),
  );
}
