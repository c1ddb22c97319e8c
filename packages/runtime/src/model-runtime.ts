/**
 * Making a model: what Triton's core sets up for every backend, done once here for every
 * Trellis backend (a TypeScript stage, a user's model.js, an ONNX session pool, a Python model,
 * an ensemble, a remote model). From its config: the request checks, the scheduler (sequence
 * batching, then dynamic batching, or each request alone: queued for an instance, or at once for a
 * backend that bounds its own work), instance_group's instances under the rate limiter and the
 * backend's own admission (e.g. the CPU gate), statistics; the result is one Model (model.ts),
 * which runs the requests.
 */
import { create } from "@bufbuild/protobuf";
import {
  type ModelConfig,
  type ModelDynamicBatching,
  ModelDynamicBatchingSchema,
  ModelInstanceGroup_Kind,
  type ModelStatistics,
} from "@trellis/protocol";
import {
  Code,
  datatypeFromConfig,
  type InferRequest,
  type RateLimiter,
  type Stage,
  StageError,
  type StageLogger,
  StatisticsRecorder,
} from "@trellis/stage";
import {
  checkInferRequest,
  decoupledRefusal,
  groupInstanceCount,
  instanceGroupsOf,
  type RateLimiterSlot,
  type RequestSpec,
} from "@trellis/stage/backend";
import type { ModelBackend } from "./backend.js";
import type { ModelInterceptor } from "./interceptors/chain.js";
import { Model, type ModelParts, unregister } from "./model.js";
import { rateLimiterResources } from "./rate-limiter.js";
import { DirectScheduler } from "./schedulers/direct.js";
import {
  type BatchingStrategy,
  createIsolatedBatcher,
  isolatedRequestsExecutor,
  mergedExecutor,
} from "./schedulers/dynamic/batcher.js";
import { FailureIsolation } from "./schedulers/dynamic/isolation.js";
import { createSequenceBatcher, type SequenceBatcher, sequenceTensors } from "./schedulers/sequence/batcher.js";

export { definitionBackend, type ModelBackend, stageBackend } from "./backend.js";

type Release = () => void;

export interface ModelRuntimeOptions {
  config: ModelConfig;
  /** Version served; default "1". */
  version?: string;
  /** Owned by the runtime from here: closed by its close, or when creating the runtime fails. */
  backend: ModelBackend;
  /** The server's rate limiter: each instance registers with its group's rate_limiter resources. */
  rateLimiter?: RateLimiter;
  /** `<repository>/<model>`: where sequence_batching's initial_state files are read. */
  modelDir?: string;
  /** The dynamic batcher's strategy (see BatchingStrategy); default: the config's parameter dynamic_batching_strategy, else "delay" (Triton's). */
  strategy?: BatchingStrategy;
  /** The server's queue bound for a config that sets no max_queue_size (--default-max-queue-size); 0: none. */
  defaultMaxQueueSize?: number;
  /**
   * The model's cross-cutting features, in order, the first outermost (interceptors/: tracing,
   * the response cache, classification; the repository adds shadow mode). Default: none.
   */
  interceptors?: readonly ModelInterceptor[];
  /** Every version of the model being served, for its metadata (Triton lists them all); default: this one. */
  versions?: () => string[];
  logger?: StageLogger;
}

/** What createModel takes: a backend and its config (see ModelRuntimeOptions). */
export type ModelOptions = ModelRuntimeOptions;

/**
 * A served model: a Stage whose queue the server can see.
 * @deprecated use Model (what createModel makes), which implements it.
 */
export interface ModelRuntime extends Stage {
  /** Its statistics, recorded here once per request. */
  statistics(): ModelStatistics;
  /** Requests queued in the runtime (and in the backend, when it has a queue of its own). */
  pendingRequests?(): number;
  /** The most requests it holds pending before refusing more (0: unbounded). */
  maxQueueSize(): number;
}

/** instance_group's instances in order (a GPU group: count per device), each with its rate_limiter. */
function instanceResources(config: ModelConfig) {
  const list: ReturnType<typeof rateLimiterResources>[] = [];
  for (const g of instanceGroupsOf(config)) {
    const devices = g.kind === ModelInstanceGroup_Kind.GPU ? Math.max(1, g.gpus.length) : 1;
    const resources = rateLimiterResources(g.rateLimiter);
    for (let i = 0; i < groupInstanceCount(config, g) * devices; i++) list.push(resources);
  }
  return list;
}

/**
 * The executions instance_group asks for: the sum of its counts (a GPU group's per device), a
 * group without a count as Triton fills it (groupInstanceCount: 2 for an onnxruntime CPU group).
 */
export function instanceCount(config: ModelConfig): number {
  return instanceResources(config).length || 1;
}

/** What a request is checked against by default: the config's inputs (and a sequence model's control and state ones) and outputs. */
export function configRequestSpec(config: ModelConfig): RequestSpec {
  const sequence = sequenceTensors(config);
  return {
    model: config.name,
    maxBatchSize: config.maxBatchSize,
    inputs: [
      ...config.input.map((c) => ({
        name: c.name,
        datatype: datatypeFromConfig(c.dataType),
        dims: c.dims.map(Number),
        optional: c.optional,
      })),
      ...sequence.inputs.map((s) => ({ name: s.name, datatype: s.datatype, dims: s.dims })),
    ],
    outputs: [...config.output.map((o) => o.name), ...sequence.outputs.map((o) => o.name)],
  };
}

/**
 * The batching the dynamic batcher does: dynamic_batching's, or for a sequence model the
 * strategy's delay and preferred sizes, so heads of different sequences batch together.
 */
function batchingOf(config: ModelConfig): ModelDynamicBatching | undefined {
  const choice = config.schedulingChoice;
  if (choice.case === "dynamicBatching") return choice.value;
  if (choice.case !== "sequenceBatching") return undefined;
  const strategy = choice.value.strategyChoice;
  return create(ModelDynamicBatchingSchema, {
    maxQueueDelayMicroseconds: strategy.value?.maxQueueDelayMicroseconds ?? 0n,
    preferredBatchSize: strategy.case === "oldest" ? strategy.value.preferredBatchSize : [],
  });
}

/** Executions in flight at once for a backend without a bound of its own. */
const UNBOUNDED_SLOTS = 4096;

/**
 * The Model that serves `options.backend` under `options.config`. Refuses (and closes the
 * backend) when an instance can never run under the rate limiter or sequence_batching is
 * malformed.
 */
export async function createModel(options: ModelOptions): Promise<Model> {
  const { config, backend } = options;
  const name = config.name;
  const version = options.version ?? "1";
  const recorder = new StatisticsRecorder(name, version);
  const spec = backend.requestSpec ?? configRequestSpec(config);
  const check = backend.checksRequests ? () => 1 : (request: InferRequest) => checkInferRequest(request, spec);
  const bounded = Number.isFinite(backend.instances);
  const instances = bounded ? Math.max(1, Math.floor(backend.instances)) : UNBOUNDED_SLOTS;

  // Each instance's place in the rate limiter (--rate-limit execution_count).
  const slots: RateLimiterSlot[] = [];
  let sequencer: SequenceBatcher | undefined;
  let strategy: BatchingStrategy;
  try {
    strategy = options.strategy ?? configBatchingStrategy(config);
    if (options.rateLimiter && bounded) {
      const groups = instanceResources(config);
      for (let i = 0; i < instances; i++) {
        slots.push(options.rateLimiter.register({ model: name, ...(groups[i] ?? rateLimiterResources(undefined)) }));
      }
    }
    if (config.schedulingChoice.case === "sequenceBatching") {
      sequencer = await createSequenceBatcher({
        config,
        ...(options.modelDir ? { modelDir: options.modelDir } : {}),
        instances: bounded ? instances : instanceCount(config),
        // The dynamic batcher, made below once the setup has succeeded, runs what the sequences send
        // (a sequence model always has one).
        run: (request, opts) => batcher!.infer(request, opts),
        onRefused: (ns) => recorder.requestFailed(ns),
      });
    }
  } catch (err) {
    unregister(slots);
    await backend.close();
    throw err;
  }

  const isolation = new FailureIsolation(recorder);
  const run = requestsExecutor(backend, name, isolation);
  const backendAdmit = backend.admit?.bind(backend);
  const admit =
    slots.length > 0
      ? (instance: number) => admitBoth(slots[instance]?.admit(), backendAdmit && (() => backendAdmit(instance)))
      : backendAdmit;
  const common = {
    name,
    version,
    maxBatchSize: config.maxBatchSize,
    recorder,
    validate: (request: InferRequest) => {
      check(request);
    },
    ...(backend.tracesSteps ? { passTrace: true } : {}),
  };
  // A backend that bounds its own work (an ensemble, a remote model), with nothing to batch or
  // admit: each request runs at once. Otherwise the dynamic batcher's queue (batching or not).
  const direct = !bounded && !admit && !sequencer && config.schedulingChoice.case !== "dynamicBatching";
  const batcher = direct
    ? undefined
    : createIsolatedBatcher(
        {
          ...common,
          dynamicBatching: batchingOf(config),
          instances,
          strategy,
          ...(admit ? { admit } : {}),
        },
        run,
        isolation,
      );
  const parts: ModelParts = {
    config,
    version,
    backend,
    recorder,
    spec,
    check,
    run,
    scheduler: batcher ?? new DirectScheduler(common, run, isolation),
    sequencer,
    slots,
    bounded,
    ...(options.defaultMaxQueueSize ? { defaultMaxQueueSize: options.defaultMaxQueueSize } : {}),
    ...(options.interceptors ? { interceptors: options.interceptors } : {}),
    ...(options.versions ? { versions: options.versions } : {}),
  };
  return new Model(parts as never);
}

/**
 * The Stage that serves `options.backend` under `options.config`.
 * @deprecated use createModel, which makes the same Model.
 */
export function createModelRuntime(options: ModelRuntimeOptions): Promise<ModelRuntime> {
  return createModel(options);
}

/**
 * The dynamic batcher's strategy its config names (parameter dynamic_batching_strategy), default
 * "delay": Triton's dynamic batcher (core src/dynamic_batch_scheduler.cc), which holds a batch short
 * of a preferred size up to max_queue_delay_microseconds, the requests held counting toward
 * max_queue_size. "eager" is Trellis's own: an idle instance takes what is queued at once.
 */
export function configBatchingStrategy(config: ModelConfig): BatchingStrategy {
  const v = config.parameters.dynamic_batching_strategy?.stringValue.trim() || "delay";
  if (v !== "delay" && v !== "eager") {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `parameter dynamic_batching_strategy: expected "delay" or "eager", got "${v}"`,
    );
  }
  return v;
}

/**
 * A run's admission: the rate limiter's resources first, then the backend's (a run waiting
 * for resources must not hold the CPU gate from others). Synchronous when both are had at once.
 */
function admitBoth(
  limited: Release | Promise<Release> | undefined,
  then: (() => Release | Promise<Release>) | undefined,
): Release | Promise<Release> {
  const both = (first: Release | undefined, second: Release | undefined) => () => {
    second?.();
    first?.();
  };
  if (typeof limited !== "function" && limited) {
    return limited.then(async (release) => both(release, await then?.()));
  }
  const second = then?.();
  if (second instanceof Promise) return second.then((release) => both(limited, release));
  return both(limited, second);
}

/** How the runtime runs a backend's batch: request by request, or merged and split back (isolating failures). */
function requestsExecutor(backend: ModelBackend, name: string, isolation: FailureIsolation) {
  if (backend.executeRequests) return isolatedRequestsExecutor(name, backend.executeRequests.bind(backend), isolation);
  const computeBatch = backend.computeBatch ?? backend.execute;
  // A decoupled backend computes only streams: its batches are never formed (infer refuses).
  if (!computeBatch) return async () => ({ responses: [decoupledRefusal(name)] });
  return mergedExecutor(name, computeBatch.bind(backend), isolation);
}
