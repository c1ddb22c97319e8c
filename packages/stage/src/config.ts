/**
 * What a stage reads from its config.pbtxt: parameters, datatypes, the metadata
 * it declares, whether it is decoupled, how many requests it queues.
 */
import { create } from "@bufbuild/protobuf";
import {
  DataType as ConfigDataType,
  type ModelConfig,
  type ModelInstanceGroup,
  ModelInstanceGroup_Kind,
  ModelInstanceGroupSchema,
  parseModelConfig,
} from "@trellis/protocol";
import { Code, StageError } from "./errors.js";
import type { StageMetadata, TensorMetadata } from "./stage.js";
import type { DataType } from "./tensor.js";

/** A model config as a library caller gives it: parsed, or the text of a config.pbtxt. */
export type ModelConfigSource = ModelConfig | string;

/**
 * The parsed config of `source`: config.pbtxt text is parsed (a syntax error is INVALID_ARGUMENT
 * naming its line), a parsed config is returned as it is. `name` fills an empty config name.
 */
export function modelConfigOf(source: ModelConfigSource, name?: string): ModelConfig {
  let config: ModelConfig;
  if (typeof source === "string") {
    try {
      config = parseModelConfig(source, name ? `${name} config` : "config");
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      throw new StageError(Code.InvalidArgument, name ?? "config", message, { cause: err });
    }
  } else {
    config = source;
  }
  if (!config.name && name) config.name = name;
  return config;
}

/** Whether `config` makes a decoupled model (model_transaction_policy { decoupled: true }). */
export const isDecoupled = (config: ModelConfig): boolean => config.modelTransactionPolicy?.decoupled === true;

/** A config `parameters` entry, trimmed; undefined when absent or blank. */
export function configParameter(config: ModelConfig, key: string): string | undefined {
  const v = config.parameters[key]?.stringValue.trim();
  return v ? v : undefined;
}

/** A whole-number config parameter ≥ `min`; undefined when absent, INVALID_ARGUMENT naming it when malformed. */
export function configInteger(config: ModelConfig, key: string, min = 0): number | undefined {
  const v = configParameter(config, key);
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < min) {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `parameter ${key}: expected a whole number ≥ ${min}, got "${v}"`,
    );
  }
  return n;
}

/** Config datatype (TYPE_FP32) to KServe datatype (FP32); TYPE_STRING is BYTES. */
export function datatypeFromConfig(dt: ConfigDataType): DataType {
  if (dt === ConfigDataType.TYPE_STRING) return "BYTES";
  if (dt === ConfigDataType.TYPE_INVALID) throw new TypeError("datatype TYPE_INVALID");
  return ConfigDataType[dt].replace(/^TYPE_/, "") as DataType;
}

/** KServe datatype (FP32) to config datatype (TYPE_FP32). */
export function datatypeToConfig(dt: DataType): ConfigDataType {
  if (dt === "BYTES") return ConfigDataType.TYPE_STRING;
  return ConfigDataType[`TYPE_${dt}` as keyof typeof ConfigDataType] as ConfigDataType;
}

/** The tensors a config declares, with the batch dimension (-1) prepended when it batches. */
export function metadataFromConfig(config: ModelConfig, versions: string[]): StageMetadata {
  const batch = config.maxBatchSize > 0 ? [-1] : [];
  const tensors = (list: { name: string; dataType: ConfigDataType; dims: bigint[] }[]): TensorMetadata[] =>
    list.map((t) => ({
      name: t.name,
      datatype: datatypeFromConfig(t.dataType),
      shape: [...batch, ...t.dims.map(Number)],
    }));
  return {
    name: config.name,
    versions,
    platform: config.platform || config.backend,
    inputs: tensors(config.input),
    outputs: tensors(config.output),
  };
}

/**
 * The bound a config's dynamic_batching queue policies put on the requests a model holds
 * queued, every priority level together: undefined when no policy sets max_queue_size (the
 * server's default bound then applies), 0 when some level is left unbounded.
 */
export function configMaxQueueSize(config: ModelConfig): number | undefined {
  const choice = config.schedulingChoice;
  if (choice.case !== "dynamicBatching") return undefined;
  const db = choice.value;
  const count = Math.max(1, Number(db.priorityLevels));
  let total = 0;
  let set = false;
  let unbounded = false;
  for (let n = 1; n <= count; n++) {
    const policy = (count > 1 ? db.priorityQueuePolicy[String(n)] : undefined) ?? db.defaultQueuePolicy;
    const max = policy?.maxQueueSize ?? 0;
    if (max > 0) set = true;
    else unbounded = true;
    total += max;
  }
  if (!set) return undefined;
  return unbounded ? 0 : total;
}

/** Triton's `default_cpu_instance_count`: what an onnxruntime or tensorflow CPU group without a count runs. */
export const DEFAULT_CPU_INSTANCE_COUNT = 2;

/** Whether Triton gives this model's CPU groups without a count DEFAULT_CPU_INSTANCE_COUNT (its onnxruntime and tensorflow backends). */
function countsTwoCpuInstances(config: ModelConfig): boolean {
  const backend = config.backend || config.platform.replace(/_.*$/, "");
  return backend === "onnxruntime" || backend === "tensorflow";
}

/**
 * The instances `group` runs per device, as Triton's SetDefaultInstanceCount fills it: its count,
 * or without one, 2 for an onnxruntime or tensorflow CPU group (KIND_AUTO is the CPU here, a
 * build without GPUs to pick) and 1 for any other.
 */
export function groupInstanceCount(config: ModelConfig, group: ModelInstanceGroup): number {
  if (group.count >= 1) return group.count;
  const cpu = group.kind === ModelInstanceGroup_Kind.CPU || group.kind === ModelInstanceGroup_Kind.AUTO;
  return cpu && countsTwoCpuInstances(config) ? DEFAULT_CPU_INSTANCE_COUNT : 1;
}

/** The model's instance groups: its own, or Triton's default (one KIND_AUTO group, no count) when it names none. */
export function instanceGroupsOf(config: ModelConfig): ModelInstanceGroup[] {
  return config.instanceGroup.length > 0
    ? config.instanceGroup
    : [create(ModelInstanceGroupSchema, { name: config.name })];
}
