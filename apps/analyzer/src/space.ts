/**
 * What the analyzer tunes in each step of an ensemble, read from and written to the step's
 * ModelConfig (config.pbtxt is the source of truth): the instance count, the dynamic batcher
 * (the batch it dispatches at once, and how long it waits to fill one) and, for ONNX steps,
 * ONNX Runtime's intra-op threads.
 */
import { create } from "@bufbuild/protobuf";
import {
  type ModelConfig,
  ModelDynamicBatchingSchema,
  ModelInstanceGroup_Kind,
  ModelInstanceGroupSchema,
  ModelParameterSchema,
} from "@trellis/protocol";
import { groupInstanceCount, instanceGroupsOf } from "@trellis/stage/backend";

export interface StepSettings {
  /** instance_group count (one KIND_CPU group). */
  count: number;
  /**
   * The batch the dynamic batcher dispatches as soon as it has it (preferred_batch_size [n]);
   * 0: no dynamic_batching, every request runs alone. max_batch_size, the model's contract
   * (the ensemble requires it to be at least its own), is never changed.
   */
  maxBatch: number;
  /** max_queue_delay_microseconds: how long a batch smaller than maxBatch waits for more. */
  delayUs: number;
  /** ONNX steps: the intra_op_thread_count parameter; 0 = the backend's default (cores / instances). */
  threads: number;
}

/** One setting of every tuned step, by step model name. */
export type Candidate = Record<string, StepSettings>;

export type Dimension = keyof StepSettings;

/** The values tried per dimension; `count` and `threads` go 1..cores. */
export interface SearchSpace {
  cores: number;
  counts: number[];
  maxBatches: number[];
  delaysUs: number[];
  threads: number[];
}

export function searchSpace(cores: number, quick: boolean): SearchSpace {
  const upTo = Array.from({ length: Math.max(1, cores) }, (_, i) => i + 1);
  return quick
    ? { cores, counts: upTo, maxBatches: [0, 4], delaysUs: [0, 2000], threads: upTo }
    : { cores, counts: upTo, maxBatches: [0, 2, 4, 8, 16], delaysUs: [0, 1000, 5000, 20000, 100000], threads: upTo };
}

export const isOnnx = (config: ModelConfig) =>
  config.platform === "onnxruntime_onnx" || config.backend === "onnxruntime";

function parameter(config: ModelConfig, key: string): string | undefined {
  return config.parameters[key]?.stringValue;
}

/** A step's settings as its config has them. */
export function readSettings(config: ModelConfig): StepSettings {
  const batching = config.schedulingChoice.case === "dynamicBatching" ? config.schedulingChoice.value : undefined;
  // As the server runs it: a group without a count gets Triton's default (2 for an onnxruntime CPU group).
  const count = instanceGroupsOf(config).reduce((sum, g) => sum + groupInstanceCount(config, g), 0);
  const preferred = batching?.preferredBatchSize ?? [];
  return {
    count,
    // The batcher dispatches at the smallest preferred size it reaches first; with none, at max_batch_size.
    maxBatch: batching ? (preferred.length > 0 ? Math.min(...preferred) : config.maxBatchSize) : 0,
    delayUs: batching ? Number(batching.maxQueueDelayMicroseconds) : 0,
    threads: Number(parameter(config, "intra_op_thread_count") ?? 0) || 0,
  };
}

/** `config` with `settings` applied (a new message; the rest of the config is kept as it is). */
export function applySettings(config: ModelConfig, settings: StepSettings): ModelConfig {
  const edited: ModelConfig = { ...config, parameters: { ...config.parameters } };
  const kind = config.instanceGroup[0]?.kind ?? ModelInstanceGroup_Kind.CPU;
  edited.instanceGroup = [create(ModelInstanceGroupSchema, { kind, count: settings.count })];
  const batching = settings.maxBatch > 0 && config.maxBatchSize > 0;
  const existing = config.schedulingChoice.case === "dynamicBatching" ? config.schedulingChoice.value : undefined;
  if (batching) {
    // Kept from the shipped batcher: its queue policies and priorities; only size and delay change.
    const value = existing ? { ...existing } : create(ModelDynamicBatchingSchema);
    value.preferredBatchSize = [Math.min(settings.maxBatch, config.maxBatchSize)];
    value.maxQueueDelayMicroseconds = BigInt(settings.delayUs);
    edited.schedulingChoice = { case: "dynamicBatching", value };
  } else if (existing) {
    edited.schedulingChoice = { case: undefined };
  }
  if (isOnnx(config) && settings.threads > 0) {
    edited.parameters.intra_op_thread_count = create(ModelParameterSchema, { stringValue: String(settings.threads) });
  } else {
    delete edited.parameters.intra_op_thread_count;
  }
  return edited;
}

/** Values of `dimension` to try for a step, or none when it does not apply. */
export function valuesOf(dimension: Dimension, space: SearchSpace, config: ModelConfig, current: StepSettings) {
  if (dimension === "count") return space.counts;
  if (dimension === "threads") return isOnnx(config) ? space.threads : [];
  if (config.maxBatchSize <= 0) return [];
  if (dimension === "maxBatch") return space.maxBatches;
  return current.maxBatch > 0 ? space.delaysUs : [];
}

export const DIMENSIONS: Dimension[] = ["count", "maxBatch", "delayUs", "threads"];

/** Settings in a few words: "count 2, batch 4 / 2 ms, threads 1". */
export function describeSettings(s: StepSettings): string {
  const batch = s.maxBatch > 0 ? `batch ${s.maxBatch} / ${s.delayUs / 1000} ms` : "no batching";
  return [`count ${s.count}`, batch, ...(s.threads > 0 ? [`threads ${s.threads}`] : [])].join(", ");
}

/** What differs between two candidates, step by step ("preprocess: count 1 → 2"); "" when nothing. */
export function describeChange(from: Candidate, to: Candidate): string {
  const parts: string[] = [];
  for (const [step, s] of Object.entries(to)) {
    const before = from[step];
    if (before && describeSettings(before) !== describeSettings(s)) {
      parts.push(`${step}: ${describeSettings(s)}`);
    }
  }
  return parts.join("; ");
}

export const sameCandidate = (a: Candidate, b: Candidate) => describeChange(a, b) === "";
