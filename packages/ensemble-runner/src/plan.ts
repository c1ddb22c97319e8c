/**
 * Load-time half of the ensemble: turns `ensemble_scheduling` plus the
 * resolved step stages into a validated DAG, or one error listing every
 * problem found (Triton's ensemble rules, plus datatype/shape agreement).
 */
import type { ModelConfig, ModelEnsembling } from "@trellis/protocol";
import {
  Code,
  type DataType,
  formatShape,
  metadataFromConfig,
  type Stage,
  StageError,
  type StageMetadata,
  type TensorMetadata,
} from "@trellis/stage";

/** Where an ensemble tensor comes from: an ensemble input, or step `step`'s output `output`. */
export type Producer = { kind: "input"; meta: TensorMetadata } | { kind: "step"; step: number; output: string };

export interface StepPlan {
  index: number;
  model: string;
  /** "step 1 resnet50_inference": how errors and statistics name the step. */
  label: string;
  stage: Stage;
  /** Step input name <- ensemble tensor name. */
  inputs: { name: string; tensor: string }[];
  /** Step output name -> ensemble tensor name, with the datatype the step declares. */
  outputs: { name: string; tensor: string; datatype: DataType }[];
  /** Distinct steps this one waits for. */
  dependsOn: number[];
  /** Distinct steps waiting for this one. */
  dependents: number[];
}

export interface EnsemblePlan {
  steps: StepPlan[];
  /** Ensemble tensor -> its producer. */
  producers: Map<string, Producer>;
  /** Ensemble tensor -> the steps reading it. */
  consumers: Map<string, number[]>;
  /** A topological order of the steps (for reporting; execution is event-driven). */
  order: number[];
}

export function ensembling(config: ModelConfig): ModelEnsembling {
  const choice = config.schedulingChoice;
  if (choice.case !== "ensembleScheduling" || choice.value.step.length === 0) {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      "an ensemble needs ensemble_scheduling with at least one step",
    );
  }
  return choice.value;
}

export const stepLabel = (index: number, model: string) => `step ${index} ${model}`;

/** -1 entries match anything; otherwise lengths and every dimension must agree. */
function shapesCompatible(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === -1 || b[i] === -1 || d === b[i]);
}

/**
 * Triton's ensemble tensor check (core's ValidateTensorConsistency): two views of a tensor agree
 * when their dims do, or their full shapes (the batch dim, -1, in front where the model batches)
 * do. So a non-batching ensemble's [-1,-1] feeds a batching step's [-1], and a batching step's
 * [4] feeds a non-batching step's [4]; a wrong shape left is refused by the step at run time.
 * `shape` is the full shape (metadata's); `batching` says whether it has that batch dim in front.
 */
function tensorsConsistent(
  a: { shape: readonly number[]; batching: boolean },
  b: { shape: readonly number[]; batching: boolean },
): boolean {
  const dims = (t: typeof a) => (t.batching ? t.shape.slice(1) : t.shape);
  return shapesCompatible(a.shape, b.shape) || shapesCompatible(dims(a), dims(b));
}

const describe = (m: TensorMetadata) => `${m.datatype} ${formatShape(m.shape)}`;

/**
 * Validates the ensemble against its steps and builds the DAG. `stages[i]`
 * is step i's resolved stage; `metas[i]` its metadata.
 */
export function planEnsemble(config: ModelConfig, stages: Stage[], metas: StageMetadata[]): EnsemblePlan {
  const spec = ensembling(config);
  const problems: string[] = [];
  const ensembleMeta = metadataFromConfig(config, []);
  const producers = new Map<string, Producer>();
  const consumers = new Map<string, number[]>();
  const producerLabel = (p: Producer, tensor: string) =>
    p.kind === "input"
      ? `ensemble input "${tensor}"`
      : `${stepLabel(p.step, spec.step[p.step]!.modelName)} output "${p.output}"`;

  for (const input of ensembleMeta.inputs) producers.set(input.name, { kind: "input", meta: input });
  if (config.output.length === 0) problems.push("the ensemble declares no outputs");

  const steps: StepPlan[] = spec.step.map((s, index) => {
    const stage = stages[index]!;
    const meta = metas[index]!;
    const label = stepLabel(index, s.modelName);
    // Triton's rule: every request the ensemble admits must fit every step.
    if (config.maxBatchSize > stage.config.maxBatchSize) {
      problems.push(
        `ensemble max_batch_size ${config.maxBatchSize} is larger than ${label}'s max_batch_size ${stage.config.maxBatchSize}`,
      );
    }
    const inputs = Object.entries(s.inputMap).map(([name, tensor]) => ({ name, tensor }));
    for (const { name } of inputs) {
      if (!meta.inputs.some((m) => m.name === name)) {
        problems.push(
          `${label}: input_map names input "${name}", but ${s.modelName} has inputs [${meta.inputs.map((m) => m.name).join(", ")}]`,
        );
      }
    }
    for (const m of meta.inputs) {
      const optional = stage.config.input.find((i) => i.name === m.name)?.optional ?? false;
      if (!optional && !(m.name in s.inputMap))
        problems.push(`${label}: required input "${m.name}" is not in input_map`);
    }
    const outputs: StepPlan["outputs"] = [];
    for (const [name, tensor] of Object.entries(s.outputMap)) {
      const om = meta.outputs.find((m) => m.name === name);
      if (!om) {
        problems.push(
          `${label}: output_map names output "${name}", but ${s.modelName} has outputs [${meta.outputs.map((m) => m.name).join(", ")}]`,
        );
        continue;
      }
      outputs.push({ name, tensor, datatype: om.datatype });
      const previous = producers.get(tensor);
      if (previous) {
        problems.push(
          `tensor "${tensor}" is written twice: by ${producerLabel(previous, tensor)} and by ${label} output "${name}"`,
        );
      } else {
        producers.set(tensor, { kind: "step", step: index, output: name });
      }
    }
    for (const { tensor } of inputs) consumers.set(tensor, [...(consumers.get(tensor) ?? []), index]);
    return { index, model: s.modelName, label, stage, inputs, outputs, dependsOn: [], dependents: [] };
  });

  const metaOf = (p: Producer): TensorMetadata | undefined =>
    p.kind === "input" ? p.meta : metas[p.step]!.outputs.find((m) => m.name === p.output);
  const ensembleBatches = config.maxBatchSize > 0;
  const producerBatches = (p: Producer) =>
    p.kind === "input" ? ensembleBatches : stages[p.step]!.config.maxBatchSize > 0;

  // Every read has a producer whose datatype and shape agree with the reader.
  for (const step of steps) {
    const meta = metas[step.index]!;
    for (const { name, tensor } of step.inputs) {
      const p = producers.get(tensor);
      if (!p) {
        problems.push(
          `${step.label}: input "${name}" reads tensor "${tensor}", which no step or ensemble input produces`,
        );
        continue;
      }
      if (p.kind === "step" && !step.dependsOn.includes(p.step)) step.dependsOn.push(p.step);
      const want = meta.inputs.find((m) => m.name === name);
      const have = metaOf(p);
      const consistent =
        want &&
        have &&
        tensorsConsistent(
          { shape: want.shape, batching: step.stage.config.maxBatchSize > 0 },
          { shape: have.shape, batching: producerBatches(p) },
        );
      if (want && have && (want.datatype !== have.datatype || !consistent)) {
        problems.push(
          `tensor "${tensor}": ${producerLabel(p, tensor)} is ${describe(have)}, but ${step.label} input "${name}" expects ${describe(want)}`,
        );
      }
    }
  }
  for (const out of ensembleMeta.outputs) {
    const p = producers.get(out.name);
    if (p?.kind !== "step") {
      problems.push(`ensemble output "${out.name}" is not produced by any step (no output_map writes it)`);
      continue;
    }
    const have = metaOf(p);
    const consistent =
      have &&
      tensorsConsistent(
        { shape: out.shape, batching: ensembleBatches },
        { shape: have.shape, batching: producerBatches(p) },
      );
    if (have && (have.datatype !== out.datatype || !consistent)) {
      problems.push(
        `ensemble output "${out.name}" is declared ${describe(out)}, but ${producerLabel(p, out.name)} is ${describe(have)}`,
      );
    }
  }
  for (const step of steps) for (const d of step.dependsOn) steps[d]!.dependents.push(step.index);

  const order = topologicalOrder(steps);
  if (order.length < steps.length) problems.push(`cycle: ${findCycle(steps, order).join(" -> ")}`);

  if (problems.length > 0) {
    throw new StageError(Code.InvalidArgument, config.name, `invalid ensemble: ${problems.join("; ")}`);
  }
  return { steps, producers, consumers, order };
}

function topologicalOrder(steps: StepPlan[]): number[] {
  const missing = steps.map((s) => s.dependsOn.length);
  const queue = steps.filter((s) => s.dependsOn.length === 0).map((s) => s.index);
  const order: number[] = [];
  while (queue.length > 0) {
    const i = queue.shift()!;
    order.push(i);
    for (const d of steps[i]!.dependents) {
      missing[d]! -= 1;
      if (missing[d] === 0) queue.push(d);
    }
  }
  return order;
}

/** One cycle among the steps Kahn's algorithm could not order, as step labels. */
function findCycle(steps: StepPlan[], ordered: number[]): string[] {
  const done = new Set(ordered);
  const start = steps.find((s) => !done.has(s.index))!.index;
  // Walking back along unordered producers must revisit a step: that loop is a cycle.
  const path: number[] = [];
  let at = start;
  while (!path.includes(at)) {
    path.push(at);
    at = steps[at]!.dependsOn.find((d) => !done.has(d))!;
  }
  const cycle = path.slice(path.indexOf(at)).reverse();
  // Start the report at the lowest step index, so the message does not depend on where the walk began.
  const first = cycle.indexOf(Math.min(...cycle));
  const rotated = [...cycle.slice(first), ...cycle.slice(0, first)];
  return [...rotated, rotated[0]!].map((i) => steps[i]!.label);
}
