/**
 * What the ensemble admits: how many requests at once (its tightest step's queue bound), and
 * which requests (Triton's checks against the ensemble's own tensors and outputs).
 */
import type { ModelConfig } from "@trellis/protocol";
import {
  Code,
  type InferRequest,
  type RequestedOutput,
  type Stage,
  StageError,
  type StageMetadata,
} from "@trellis/stage";
import { configMaxQueueSize, type RequestSpec, requestRefusal, tritonMessages } from "@trellis/stage/backend";
import { type EnsemblePlan, type StepPlan, stepLabel } from "./plan.js";

/**
 * The most requests the ensemble admits at once, and the step that sets it: each step's queue
 * bound (what the step says, else its config's max_queue_size), shared among the steps calling
 * the same model; the tightest wins. Admitting no more than that, no step's queue overflows
 * with this ensemble's requests, so none is refused after an earlier step did its work (a
 * decoded image refused by the inference step). Read per request, from the stages the latest
 * request held: a step may have been reloaded with another bound.
 */
export class EntryBound {
  /** How many steps call each stage: a stage two steps call sees each request twice. */
  private readonly calls = new Map<string, number>();

  constructor(
    private readonly plan: EnsemblePlan,
    /** The steps' stages now (by step index): those the latest request held. */
    private readonly stages: () => readonly Stage[] = () => plan.steps.map((s) => s.stage),
  ) {
    for (const s of plan.steps) this.calls.set(s.model, (this.calls.get(s.model) ?? 0) + 1);
  }

  get(): { bound: number; step?: StepPlan } {
    let bound = 0;
    let which: StepPlan | undefined;
    const stages = this.stages();
    for (const s of this.plan.steps) {
      const stage = stages[s.index] ?? s.stage;
      const own = stage.maxQueueSize?.() ?? configMaxQueueSize(stage.config) ?? 0;
      if (own <= 0) continue;
      const share = Math.max(1, Math.floor(own / (this.calls.get(s.model) ?? 1)));
      if (bound === 0 || share < bound) {
        bound = share;
        which = s;
      }
    }
    return { bound, step: which };
  }

  /** The bound, and the step that sets it, in a refusal's words. */
  described(): { bound: number; what: string } {
    const { bound, step } = this.get();
    return { bound, what: step ? `the queue bound of ${stepLabel(step.index, step.model)} (${bound})` : "" };
  }
}

/** The ensemble's own tensors, as Triton checks a request against them. */
export function ensembleRequestSpec(config: ModelConfig, metadata: StageMetadata): RequestSpec {
  const batching = config.maxBatchSize > 0;
  return {
    model: config.name,
    maxBatchSize: config.maxBatchSize,
    inputs: metadata.inputs.map((m) => ({
      name: m.name,
      datatype: m.datatype,
      dims: batching ? m.shape.slice(1) : m.shape,
      optional: config.input.find((i) => i.name === m.name)?.optional ?? false,
    })),
    outputs: metadata.outputs.map((o) => o.name),
  };
}

/** Which ensemble outputs to return, and the per-step requested outputs (classification passes through). */
export function requestedOutputs(
  name: string,
  plan: EnsemblePlan,
  metadata: StageMetadata,
  request: InferRequest,
): { wanted: string[]; perStep: RequestedOutput[][] } {
  const perStep = plan.steps.map((s) => s.outputs.map((o): RequestedOutput => ({ name: o.name })));
  const asked = request.outputs ?? [];
  if (asked.length === 0) return { wanted: metadata.outputs.map((o) => o.name), perStep };
  for (const o of asked) {
    if (!metadata.outputs.some((m) => m.name === o.name)) {
      throw requestRefusal(tritonMessages.unexpectedOutput(name, o.name));
    }
    // Classification is the frontend's, done once on the ensemble's answer (as Triton's
    // src/classification.cc); the step producing the tensor gets the output's other parameters.
    const { classification: _, ...stepParameters } = o.parameters ?? {};
    if (Object.keys(stepParameters).length > 0) {
      // The step producing it does the work, unless another step reads the tensor.
      if (plan.consumers.has(o.name)) {
        throw new StageError(
          Code.InvalidArgument,
          name,
          `output "${o.name}": parameters are not supported on a tensor other steps also read`,
        );
      }
      const p = plan.producers.get(o.name);
      if (p?.kind === "step") {
        const r = perStep[p.step]!.find((x) => x.name === p.output)!;
        r.parameters = stepParameters;
      }
    }
  }
  return { wanted: asked.map((o) => o.name), perStep };
}
