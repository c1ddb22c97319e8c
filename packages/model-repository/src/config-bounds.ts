/**
 * What one model's config may ask of the server. A config sizes memory (instances, queue levels,
 * sequence slots, warmup tensors), threads (instances) and timers (queue delays and timeouts);
 * Triton takes any value its proto holds, so a config from a load request (or a repository) could
 * ask for 2^31 instances or a 2^62 µs delay and take the process down. Each value is checked here
 * before anything loads, for configs on disk and load overrides alike.
 */
import { availableParallelism } from "node:os";
import { DataType, type ModelConfig } from "@trellis/protocol";
import { groupInstanceCount, instanceGroupsOf } from "@trellis/stage/backend";

export interface ConfigBounds {
  /** Instances one model may run, summed over its instance groups (--max-instances-per-model). */
  maxInstancesPerModel: number;
}

/** --max-instances-per-model's default: two per CPU core, at least 4. */
export function defaultMaxInstancesPerModel(): number {
  return Math.max(4, 2 * availableParallelism());
}

/** Node's longest timer (2^31 - 1 ms), in microseconds: a longer delay would fire at once. */
export const MAX_TIMER_MICROSECONDS = 2_147_483_647n * 1000n;
/** Priority levels of a dynamic batcher (each is a queue). */
export const MAX_PRIORITY_LEVELS = 10_000n;
/** Sequence slots per instance (max_candidate_sequences, or max_batch_size without one). */
export const MAX_SEQUENCE_SLOTS = 65_536;
/** How many times a warmup sample may run. */
export const MAX_WARMUP_COUNT = 1_000;
/** Bytes of one tensor a config makes the server allocate (a warmup input, an initial state). */
export const MAX_CONFIG_TENSOR_BYTES = 256 * 1024 * 1024;
/** Threads one ONNX Runtime session may ask for (intra_op_thread_count, inter_op_thread_count): four per core, at least 16. */
export const maxThreadsPerSession = (): number => Math.max(16, 4 * availableParallelism());

const BYTES_PER_ELEMENT: Partial<Record<DataType, number>> = {
  [DataType.TYPE_BOOL]: 1,
  [DataType.TYPE_UINT8]: 1,
  [DataType.TYPE_INT8]: 1,
  [DataType.TYPE_UINT16]: 2,
  [DataType.TYPE_INT16]: 2,
  [DataType.TYPE_FP16]: 2,
  [DataType.TYPE_BF16]: 2,
  [DataType.TYPE_UINT32]: 4,
  [DataType.TYPE_INT32]: 4,
  [DataType.TYPE_FP32]: 4,
};

/** Bytes a tensor of `datatype` and `shape` takes (8 per element for 64-bit types and strings). */
function tensorBytes(datatype: DataType, shape: bigint[]): bigint {
  let elements = 1n;
  for (const d of shape) elements *= d < 1n ? 1n : d;
  return elements * BigInt(BYTES_PER_ELEMENT[datatype] ?? 8);
}

/** The instances a config asks for: each group's count (at least 1), per GPU for a GPU group. */
export function instancesAskedFor(config: ModelConfig): number {
  let total = 0;
  for (const g of instanceGroupsOf(config)) total += groupInstanceCount(config, g) * Math.max(1, g.gpus.length);
  return Math.max(1, total);
}

function timerProblems(config: ModelConfig): string[] {
  const timers: [string, bigint | undefined][] = [];
  const s = config.schedulingChoice;
  if (s.case === "dynamicBatching") {
    const db = s.value;
    timers.push(["dynamic_batching.max_queue_delay_microseconds", db.maxQueueDelayMicroseconds]);
    timers.push([
      "dynamic_batching.default_queue_policy.default_timeout_microseconds",
      db.defaultQueuePolicy?.defaultTimeoutMicroseconds,
    ]);
    for (const [level, policy] of Object.entries(db.priorityQueuePolicy)) {
      timers.push([
        `dynamic_batching.priority_queue_policy[${level}].default_timeout_microseconds`,
        policy.defaultTimeoutMicroseconds,
      ]);
    }
  }
  if (s.case === "sequenceBatching") {
    const sb = s.value;
    timers.push(["sequence_batching.max_sequence_idle_microseconds", sb.maxSequenceIdleMicroseconds]);
    const strategy = sb.strategyChoice;
    if (strategy.case) {
      timers.push([
        `sequence_batching.${strategy.case}.max_queue_delay_microseconds`,
        strategy.value.maxQueueDelayMicroseconds,
      ]);
    }
  }
  return timers
    .filter(([, us]) => us !== undefined && us > MAX_TIMER_MICROSECONDS)
    .map(([field, us]) => `${field} ${us} is more than the ${MAX_TIMER_MICROSECONDS} a timer can wait`);
}

function sizeProblems(config: ModelConfig): string[] {
  const problems: string[] = [];
  const s = config.schedulingChoice;
  if (s.case === "dynamicBatching" && s.value.priorityLevels > MAX_PRIORITY_LEVELS) {
    problems.push(`dynamic_batching.priority_levels ${s.value.priorityLevels} is more than ${MAX_PRIORITY_LEVELS}`);
  }
  if (s.case === "sequenceBatching") {
    const oldest = s.value.strategyChoice.case === "oldest" ? s.value.strategyChoice.value : undefined;
    if (oldest && oldest.maxCandidateSequences > MAX_SEQUENCE_SLOTS) {
      problems.push(
        `sequence_batching.oldest.max_candidate_sequences ${oldest.maxCandidateSequences} is more than ${MAX_SEQUENCE_SLOTS}`,
      );
    } else if (!oldest?.maxCandidateSequences && config.maxBatchSize > MAX_SEQUENCE_SLOTS) {
      problems.push(
        `max_batch_size ${config.maxBatchSize} is more than the ${MAX_SEQUENCE_SLOTS} sequence slots an instance may have`,
      );
    }
    for (const state of s.value.state) {
      for (const init of state.initialState) {
        if (tensorBytes(state.dataType, init.dims) > BigInt(MAX_CONFIG_TENSOR_BYTES)) {
          problems.push(
            `sequence_batching state '${state.inputName}' initial_state '${init.name}' is more than ${MAX_CONFIG_TENSOR_BYTES} bytes`,
          );
        }
      }
    }
  }
  for (const key of ["intra_op_thread_count", "inter_op_thread_count"]) {
    const threads = Number(config.parameters[key]?.stringValue ?? 0);
    if (threads > maxThreadsPerSession()) {
      problems.push(
        `parameters.${key} ${threads} is more than the ${maxThreadsPerSession()} threads a session may have`,
      );
    }
  }
  for (const w of config.modelWarmup) {
    if (w.count > MAX_WARMUP_COUNT) {
      problems.push(`model_warmup '${w.name}' count ${w.count} is more than ${MAX_WARMUP_COUNT}`);
    }
    const batch = BigInt(Math.max(1, w.batchSize));
    for (const [input, spec] of Object.entries(w.inputs)) {
      if (batch * tensorBytes(spec.dataType, spec.dims) > BigInt(MAX_CONFIG_TENSOR_BYTES)) {
        problems.push(
          `model_warmup '${w.name}' input '${input}' (batch ${batch}) is more than ${MAX_CONFIG_TENSOR_BYTES} bytes`,
        );
      }
    }
  }
  return problems;
}

/**
 * Why `config` asks more of the server than one model may (INVALID_ARGUMENT's words, the flag
 * that raises a bound named where there is one), or undefined when it does not.
 */
export function configBoundsProblem(config: ModelConfig, bounds: ConfigBounds): string | undefined {
  const problems: string[] = [];
  const instances = instancesAskedFor(config);
  if (instances > bounds.maxInstancesPerModel) {
    problems.push(
      `instance_group asks for ${instances} instances, more than the ${bounds.maxInstancesPerModel} allowed; use --max-instances-per-model to raise the limit`,
    );
  }
  problems.push(...timerProblems(config), ...sizeProblems(config));
  return problems.length > 0 ? problems.join("; ") : undefined;
}
