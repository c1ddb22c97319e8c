/**
 * createPipeline: an in-process ensemble of stages the caller already holds, from a plain
 * ordered list of steps (tensors chained by position, or mapped by name) or from an ensemble
 * config whose steps name the stages. What it returns is an ordinary Stage (an EnsembleStage):
 * it can be served with listenStage or be a step of another pipeline.
 */
import { type ModelConfig, parseModelConfig } from "@trellis/protocol";
import { Code, type Stage, StageError, type StageLogger, type TensorMetadata } from "@trellis/stage";
import { type ModelConfigSource, modelConfigOf } from "@trellis/stage/backend";
import { createEnsemble, type EnsembleStage } from "./ensemble.js";

/** One step of a pipeline, with its tensors mapped by name. */
export interface PipelineStep {
  stage: Stage;
  /**
   * The step's input name → the pipeline tensor it reads (a pipeline input, or an earlier
   * step's output as mapped). Default, for a step with one input: the previous step's one
   * output (the first step's: the pipeline input of the same name).
   */
  inputs?: Record<string, string>;
  /**
   * The step's output name → the pipeline tensor it writes. Default: each output under its own
   * name for the last step (the pipeline's outputs), else under "<stage name>.<output>".
   */
  outputs?: Record<string, string>;
}

export interface PipelineOptions {
  /** The pipeline's model name (default "pipeline"): its errors and statistics carry it. */
  name?: string;
  /** Close the steps' stages when the pipeline closes (default true). */
  closeSteps?: boolean;
  logger?: StageLogger;
}

export interface PipelineFromConfig extends PipelineOptions {
  /** An ensemble config.pbtxt (parsed or as text): its steps' model_name name the stages in `stages`. */
  config: ModelConfigSource;
  /** The stages its steps name, by model_name. */
  stages: Record<string, Stage> | Map<string, Stage>;
}

const quote = (s: string) => JSON.stringify(s);
const dims = (shape: readonly number[]) => `[ ${shape.join(", ")} ]`;
const invalid = (name: string, message: string) => new StageError(Code.InvalidArgument, name, message);

interface Tensors {
  inputs: Map<string, TensorMetadata>;
  outputs: Map<string, TensorMetadata>;
}

/** The one tensor of a list, or an error naming what the mapping must say instead. */
function only(list: readonly TensorMetadata[], what: string, name: string, step: number): TensorMetadata {
  if (list.length !== 1) {
    throw invalid(
      name,
      `step ${step} (${what}) has ${list.length} tensors [${list.map((t) => t.name).join(", ")}]: map them by name (inputs / outputs)`,
    );
  }
  return list[0]!;
}

/** A step's input_map and output_map, with the defaults for a plain chain filled in. */
function stepMaps(
  step: PipelineStep,
  index: number,
  last: boolean,
  meta: Tensors,
  previous: string | undefined,
  name: string,
) {
  const stageName = step.stage.name;
  const inputs = step.inputs ?? {
    [only([...meta.inputs.values()], `${stageName} inputs`, name, index).name]:
      previous ?? only([...meta.inputs.values()], `${stageName} inputs`, name, index).name,
  };
  const outputs =
    step.outputs ?? Object.fromEntries([...meta.outputs.keys()].map((o) => [o, last ? o : `${stageName}.${o}`]));
  return { inputs, outputs };
}

/**
 * The ensemble config of a plain list of steps: every step batches (max_batch_size > 0), so the
 * pipeline does too, up to the smallest step's; otherwise it takes whole tensors (0).
 */
async function chainConfig(name: string, steps: readonly PipelineStep[]): Promise<ModelConfig> {
  if (steps.length === 0) throw invalid(name, "a pipeline needs at least one step");
  const metas = await Promise.all(steps.map((s) => s.stage.metadata()));
  const batching = steps.every((s) => s.stage.config.maxBatchSize > 0);
  const maxBatch = batching ? Math.min(...steps.map((s) => s.stage.config.maxBatchSize)) : 0;
  const item = (shape: readonly number[]) => (batching ? shape.slice(1) : shape);
  const producedBy = new Map<string, TensorMetadata>();
  const pipelineInputs = new Map<string, TensorMetadata>();
  const stepTexts: string[] = [];
  const names = new Map<string, Stage>();
  let previous: string | undefined;
  let finalOutputs: string[] = [];
  steps.forEach((step, index) => {
    const stageName = step.stage.name;
    const seen = names.get(stageName);
    if (seen && seen !== step.stage)
      throw invalid(name, `steps ${index} and another hold different stages both named ${stageName}`);
    names.set(stageName, step.stage);
    const meta: Tensors = {
      inputs: new Map(metas[index]!.inputs.map((t) => [t.name, t])),
      outputs: new Map(metas[index]!.outputs.map((t) => [t.name, t])),
    };
    const maps = stepMaps(step, index, index === steps.length - 1, meta, previous, name);
    for (const [input, tensor] of Object.entries(maps.inputs)) {
      const m = meta.inputs.get(input);
      if (!m) throw invalid(name, `step ${index} (${stageName}) has no input ${input}`);
      if (!producedBy.has(tensor) && !pipelineInputs.has(tensor)) pipelineInputs.set(tensor, { ...m, name: tensor });
    }
    for (const [output, tensor] of Object.entries(maps.outputs)) {
      const m = meta.outputs.get(output);
      if (!m) throw invalid(name, `step ${index} (${stageName}) has no output ${output}`);
      producedBy.set(tensor, { ...m, name: tensor });
    }
    const outs = Object.values(maps.outputs);
    previous = outs.length === 1 ? outs[0] : undefined;
    // The last step's outputs are the pipeline's.
    finalOutputs = outs;
    const map = (key: string, m: Record<string, string>) =>
      Object.entries(m)
        .map(([k, v]) => `${key} { key: ${quote(k)} value: ${quote(v)} }`)
        .join(" ");
    stepTexts.push(
      `step [ { model_name: ${quote(stageName)} model_version: -1 ${map("input_map", maps.inputs)} ${map("output_map", maps.outputs)} } ]`,
    );
  });
  const tensorText = (kind: string, t: TensorMetadata) =>
    `${kind} [ { name: ${quote(t.name)} data_type: ${t.datatype === "BYTES" ? "TYPE_STRING" : `TYPE_${t.datatype}`} dims: ${dims(item(t.shape))} } ]`;
  const text = [
    `name: ${quote(name)}`,
    `platform: "ensemble"`,
    `max_batch_size: ${maxBatch}`,
    ...[...pipelineInputs.values()].map((t) => tensorText("input", t)),
    ...finalOutputs.map((t) => tensorText("output", producedBy.get(t)!)),
    `ensemble_scheduling { ${stepTexts.join(" ")} }`,
  ].join("\n");
  return parseModelConfig(text, `pipeline ${name}`);
}

/**
 * An in-process pipeline of stages you hold. Give the steps in order: a Stage (one input fed by
 * the previous step's one output) or `{ stage, inputs, outputs }` mapping tensors by name. Or
 * give an ensemble config and the stages its steps name. The pipeline checks each request
 * against its inputs, runs steps as soon as their inputs are ready and passes tensors between
 * them without copies; an error names the step that failed. Its statistics are the pipeline's;
 * each stage keeps its own.
 */
export async function createPipeline(
  steps: readonly (Stage | PipelineStep)[] | PipelineFromConfig,
  options: PipelineOptions = {},
): Promise<EnsembleStage> {
  if (!Array.isArray(steps)) {
    const given = steps as PipelineFromConfig;
    const name = given.name ?? options.name ?? "pipeline";
    const config = modelConfigOf(given.config, name);
    const stages = given.stages instanceof Map ? given.stages : new Map(Object.entries(given.stages));
    return createEnsemble({
      config,
      resolveStep: (model) => {
        const stage = stages.get(model);
        if (!stage) throw new StageError(Code.NotFound, model, `no stage given for step model ${model}`);
        return stage;
      },
      ownsSteps: given.closeSteps ?? options.closeSteps ?? true,
      ...((given.logger ?? options.logger) ? { logger: given.logger ?? options.logger } : {}),
    });
  }
  const list = (steps as readonly (Stage | PipelineStep)[]).map((s) => ("stage" in s ? s : { stage: s }));
  const name = options.name ?? "pipeline";
  const config = await chainConfig(name, list);
  const byName = new Map(list.map((s) => [s.stage.name, s.stage]));
  return createEnsemble({
    config,
    resolveStep: (model) => byName.get(model)!,
    ownsSteps: options.closeSteps ?? true,
    ...(options.logger ? { logger: options.logger } : {}),
  });
}
