/**
 * What the ONNX model says about itself, checked against config.pbtxt:
 * tensor names, datatypes and dims, the batch dimension, and Triton's
 * auto-complete for configs that leave input/output out.
 */
import { clone, create } from "@bufbuild/protobuf";
import {
  type ModelConfig,
  ModelConfigSchema,
  ModelDynamicBatchingSchema,
  ModelInputSchema,
  ModelOutputSchema,
} from "@trellis/protocol";
import { type SequenceTensorSpec, sequenceTensors } from "@trellis/runtime";
import { Code, type DataType, datatypeFromConfig, formatShape, StageError } from "@trellis/stage";
import { datatypeToConfig } from "@trellis/stage/backend";
import type { ModelTensorInfo } from "./protocol.js";

const ORT_TO_KSERVE: Record<string, DataType> = {
  float32: "FP32",
  float64: "FP64",
  float16: "FP16",
  int8: "INT8",
  uint8: "UINT8",
  int16: "INT16",
  uint16: "UINT16",
  int32: "INT32",
  uint32: "UINT32",
  int64: "INT64",
  uint64: "UINT64",
  bool: "BOOL",
  string: "BYTES",
};

const KSERVE_TO_ORT = Object.fromEntries(Object.entries(ORT_TO_KSERVE).map(([o, k]) => [k, o])) as Record<
  string,
  string
>;

/** KServe datatype of an ORT element type, or undefined when Trellis cannot carry it. */
export function datatypeFromOrt(type: string): DataType | undefined {
  return ORT_TO_KSERVE[type];
}

export function ortTypeOf(datatype: DataType): string {
  const t = KSERVE_TO_ORT[datatype];
  if (!t) throw new TypeError(`datatype ${datatype} has no onnxruntime-node tensor type`);
  return t;
}

export interface ModelIO {
  inputs: ModelTensorInfo[];
  outputs: ModelTensorInfo[];
  /**
   * Initializers listed as graph inputs: a config input may name one (a request then leaves it
   * out for the initializer's value, or gives it to override it). Not among `inputs`.
   */
  overridable?: ModelTensorInfo[];
}

type Side = "input" | "output";

function modelDatatype(stage: string, side: Side, t: ModelTensorInfo): DataType {
  const dt = datatypeFromOrt(t.type);
  if (!dt) {
    throw new StageError(
      Code.InvalidArgument,
      stage,
      `model ${side} ${t.name} has type ${t.type}, which is not supported`,
    );
  }
  return dt;
}

/**
 * Throws a load error naming the tensor, what the config expects and what
 * the model has, for the first disagreement found.
 */
export function checkConfigAgainstModel(config: ModelConfig, model: ModelIO): void {
  const stage = config.name;
  const batching = config.maxBatchSize > 0;
  const fail = (msg: string) => new StageError(Code.InvalidArgument, stage, `model does not match its config: ${msg}`);
  const check = (side: Side, list: ModelConfig["input"] | ModelConfig["output"], modelList: ModelTensorInfo[]) => {
    const overridable = side === "input" ? (model.overridable ?? []) : [];
    for (const c of list) {
      const m = modelList.find((x) => x.name === c.name) ?? overridable.find((x) => x.name === c.name);
      if (!m) {
        const initializers = overridable.length
          ? ` (and initializers ${overridable.map((x) => x.name).join(", ")})`
          : "";
        throw fail(
          `config ${side} ${c.name} is not a model ${side}; the model's ${side}s are ${modelList.map((x) => x.name).join(", ")}${initializers}`,
        );
      }
      const expected = datatypeFromConfig(c.dataType);
      const got = modelDatatype(stage, side, m);
      if (expected !== got) throw fail(`${side} ${c.name}: config datatype ${expected}, model datatype ${got}`);
      const dims = c.dims.map(Number);
      // With reshape, the model sees the reshaped dims; clients keep seeing dims.
      const modelDims = c.reshape ? c.reshape.shape.map(Number) : dims;
      if (c.reshape) {
        const what = `dims ${formatShape(dims)}, reshape ${formatShape(modelDims)}`;
        if ([...dims, ...modelDims].some((d) => d < 0)) {
          throw fail(`${side} ${c.name}: reshape with variable dimensions is not supported (${what})`);
        }
        const count = (shape: number[]) => shape.reduce((a, b) => a * b, 1);
        if (count(dims) !== count(modelDims)) {
          throw fail(
            `${side} ${c.name}: reshape must hold as many elements as dims (${what}: ${count(modelDims)} vs ${count(dims)})`,
          );
        }
      }
      const configShape = batching ? [-1, ...modelDims] : modelDims;
      const shapeMsg = `config ${c.reshape ? `reshape ${formatShape(modelDims)}` : `dims ${formatShape(dims)}`}${batching ? ` with max_batch_size ${config.maxBatchSize} (full shape ${formatShape(configShape)})` : ""}, model shape ${formatShape(m.shape)}`;
      if (m.shape.length !== configShape.length) throw fail(`${side} ${c.name}: rank differs: ${shapeMsg}`);
      if (batching && m.shape[0] !== -1) {
        throw fail(
          `${side} ${c.name}: max_batch_size ${config.maxBatchSize} needs a dynamic first dimension, but the model fixes it to ${m.shape[0]} (model shape ${formatShape(m.shape)}); set max_batch_size: 0`,
        );
      }
      for (let i = batching ? 1 : 0; i < m.shape.length; i++) {
        const md = m.shape[i]!;
        if (md !== -1 && configShape[i] !== md) throw fail(`${side} ${c.name}: dimension ${i} differs: ${shapeMsg}`);
      }
    }
  };
  check("input", config.input, model.inputs);
  check("output", config.output, model.outputs);
  // sequence_batching's control and state tensors are model tensors the config does not list as inputs.
  const sequence = sequenceTensors(config);
  const checkSequence = (side: Side, specs: SequenceTensorSpec[], modelList: ModelTensorInfo[]) => {
    for (const s of specs) {
      const m = modelList.find((x) => x.name === s.name);
      const role = `sequence_batching ${side} ${s.name}`;
      if (!m) {
        throw fail(
          `${role} is not a model ${side}; the model's ${side}s are ${modelList.map((x) => x.name).join(", ")}`,
        );
      }
      const got = modelDatatype(stage, side, m);
      if (got !== s.datatype) throw fail(`${role}: config datatype ${s.datatype}, model datatype ${got}`);
      const shape = batching ? [-1, ...s.dims] : s.dims;
      const fits =
        m.shape.length === shape.length && m.shape.every((d, i) => d === -1 || shape[i] === -1 || d === shape[i]);
      if (!fits) throw fail(`${role}: expected shape ${formatShape(shape)}, model shape ${formatShape(m.shape)}`);
    }
  };
  checkSequence("input", sequence.inputs, model.inputs);
  checkSequence("output", sequence.outputs, model.outputs);
  for (const m of model.inputs) {
    if (!config.input.some((c) => c.name === m.name) && !sequence.inputs.some((s) => s.name === m.name)) {
      throw fail(`model input ${m.name} (${m.type} ${formatShape(m.shape)}) is missing from the config's inputs`);
    }
  }
}

export interface AutoCompleteOptions {
  /** max_batch_size given to a model whose tensors all have a dynamic first dim (Triton's default-max-batch-size). */
  defaultMaxBatchSize?: number;
}

/**
 * Triton's auto-complete (`--strict-model-config=false`): fills a missing
 * input or output section, the platform, and for a model that can batch
 * but whose config sets no max_batch_size, max_batch_size 4 with dynamic
 * batching. Returns a new config; sections already present are kept.
 */
export function autoCompleteConfig(
  config: ModelConfig,
  model: ModelIO,
  options: AutoCompleteOptions = {},
): ModelConfig {
  const out = clone(ModelConfigSchema, config);
  if (!out.platform && !out.backend) out.platform = "onnxruntime_onnx";
  const fillInputs = out.input.length === 0;
  const fillOutputs = out.output.length === 0;
  if (!fillInputs && !fillOutputs) return out;
  // The sequence batcher's control and state tensors are not the config's inputs and outputs.
  const sequence = sequenceTensors(config);
  const skip = new Set([...sequence.inputs, ...sequence.outputs].map((s) => s.name));
  model = {
    inputs: model.inputs.filter((t) => !skip.has(t.name)),
    outputs: model.outputs.filter((t) => !skip.has(t.name)),
  };
  const all = [...model.inputs, ...model.outputs];
  const canBatch = all.length > 0 && all.every((t) => t.shape.length > 0 && t.shape[0] === -1);
  if (out.maxBatchSize === 0 && canBatch && fillInputs && fillOutputs) {
    out.maxBatchSize = options.defaultMaxBatchSize ?? 4;
    if (out.schedulingChoice.case === undefined) {
      out.schedulingChoice = { case: "dynamicBatching", value: create(ModelDynamicBatchingSchema) };
    }
  }
  const dims = (t: ModelTensorInfo) => (out.maxBatchSize > 0 ? t.shape.slice(1) : t.shape).map(BigInt);
  if (fillInputs) {
    out.input = model.inputs.map((t) =>
      create(ModelInputSchema, {
        name: t.name,
        dataType: datatypeToConfig(modelDatatype(out.name, "input", t)),
        dims: dims(t),
      }),
    );
  }
  if (fillOutputs) {
    out.output = model.outputs.map((t) =>
      create(ModelOutputSchema, {
        name: t.name,
        dataType: datatypeToConfig(modelDatatype(out.name, "output", t)),
        dims: dims(t),
      }),
    );
  }
  return out;
}
