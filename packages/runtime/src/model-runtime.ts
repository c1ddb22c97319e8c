/**
 * The model runtime: what Triton's core does for every backend, done once here for every
 * Trellis backend (a TypeScript stage, a user's model.js, an ONNX session pool). A request is
 * checked against the config (Triton's checks, codes and words), goes through the sequence
 * batcher (sequence_batching), then the dynamic batcher (dynamic_batching merges requests; without
 * it each request runs alone through the same queue), waits for an instance (instance_group's
 * count) and its admission (the rate limiter's resources, then the backend's own, e.g. the CPU
 * gate), and runs as one `execute` call; its answers are split back per request. Statistics are
 * recorded here, once per served model. A backend only computes a batch.
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
  type InferOptions,
  type InferRequest,
  type InferResponse,
  isDecoupled,
  metadataFromConfig,
  nowNs,
  type RateLimiter,
  type Stage,
  type StageDefinition,
  StageError,
  type StageLogger,
  type StageMetadata,
  StatisticsRecorder,
  traceExecution,
} from "@trellis/stage";
import {
  checkInferRequest,
  decoupledRefusal,
  definitionOf,
  groupInstanceCount,
  instanceGroupsOf,
  pickOutputs,
  type RateLimiterSlot,
  type RequestSpec,
  toConnectError,
} from "@trellis/stage/backend";
import { Admission, type QueueBound } from "./admission.js";
import {
  type BatchContext,
  type BatchingStrategy,
  type BatchResult,
  createIsolatedBatcher,
  type DynamicBatcher,
  isolatedRequestsExecutor,
  mergedExecutor,
  type RequestsExecutor,
  type RequestsResult,
} from "./batcher.js";
import { FailureIsolation } from "./isolation.js";
import { rateLimiterResources } from "./rate-limiter.js";
import { createSequenceBatcher, type SequenceBatcher, sequenceTensors } from "./sequence-batcher.js";

type Release = () => void;

/** What a backend is to the runtime: something that computes a batch on one of its instances. */
export interface ModelBackend {
  /**
   * Executions it runs at once (instance_group's count); `Infinity`: as many as arrive (a
   * stage that bounds its own work), so requests never queue in the runtime.
   */
  instances: number;
  /**
   * Computes one batch on instance `ctx.instance`, in one of two ways (give one). `execute`: the
   * requests merged along dim 0, one result for all (a throw fails the execution; the runtime
   * then bisects the batch, so only the one that caused it fails: see isolation.ts). `executeRequests`
   * (Triton's `execute(requests)`): the requests as they are, answering each with its outputs
   * or an error of its own.
   */
  execute?(batch: InferRequest, ctx: BatchContext): Promise<BatchResult>;
  executeRequests?(requests: readonly InferRequest[], ctx: BatchContext): Promise<RequestsResult>;
  /** A decoupled model's responses to one request (no batching): checked and counted by the runtime. */
  executeStream?(request: InferRequest, options?: InferOptions): AsyncIterable<InferResponse>;
  /** Admission of one execution on `instance` after the rate limiter's (e.g. the CPU gate); gives its release. */
  admit?(instance: number): Release | Promise<Release>;
  isReady?(): boolean | Promise<boolean>;
  metadata?(): StageMetadata | Promise<StageMetadata>;
  /** Requests waiting inside the backend itself (a stage with its own queue). */
  pendingRequests?(): number;
  /** Checks to run instead of the config's: a backend with its own, looser spec (preprocess takes [N] for [N,1]). */
  requestSpec?: RequestSpec;
  /** It checks each request itself (an ensemble against its tensors, a remote model on its server): the runtime does not. */
  checksRequests?: boolean;
  /** It answers over streams only (an ensemble with a decoupled step), whatever its config says. */
  decoupled?: boolean;
  /** Its own bound on the requests in flight (an ensemble: its tightest step's queue bound). */
  queueBound?(): QueueBound;
  /** A lone request's trace goes to `execute` (an ensemble stamps its steps on it); the runtime still stamps the execution. */
  tracesSteps?: boolean;
  close(): Promise<void>;
}

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
  /** The dynamic batcher's strategy (see BatchingStrategy); default: the config's parameter dynamic_batching_strategy, else "eager". */
  strategy?: BatchingStrategy;
  /** The server's queue bound for a config that sets no max_queue_size (--default-max-queue-size); 0: none. */
  defaultMaxQueueSize?: number;
  logger?: StageLogger;
}

/** A served model: a Stage whose queue the server can see. */
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
 * The Stage that serves `options.backend` under `options.config`. Refuses (and closes the
 * backend) when an instance can never run under the rate limiter or sequence_batching is
 * malformed.
 */
export async function createModelRuntime(options: ModelRuntimeOptions): Promise<ModelRuntime> {
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
        // The dynamic batcher, made below once the setup has succeeded, runs what the sequences send.
        run: (request, opts) => batcher.infer(request, opts),
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
  const batcher = createIsolatedBatcher(
    {
      name,
      version,
      maxBatchSize: config.maxBatchSize,
      dynamicBatching: batchingOf(config),
      instances,
      strategy,
      recorder,
      validate: (request) => {
        check(request);
      },
      ...(admit ? { admit } : {}),
      ...(backend.tracesSteps ? { passTrace: true } : {}),
    },
    run,
    isolation,
  );
  const served = new ServedModel({ options, version, recorder, spec, check, run, batcher, sequencer, slots, bounded });
  return served.stage();
}

/** The dynamic batcher's strategy its config names (parameter dynamic_batching_strategy), default "eager". */
export function configBatchingStrategy(config: ModelConfig): BatchingStrategy {
  const v = config.parameters.dynamic_batching_strategy?.stringValue.trim() || "eager";
  if (v !== "delay" && v !== "eager") {
    throw new StageError(
      Code.InvalidArgument,
      config.name,
      `parameter dynamic_batching_strategy: expected "delay" or "eager", got "${v}"`,
    );
  }
  return v;
}

/** Gives each instance's place in the rate limiter back. */
function unregister(slots: RateLimiterSlot[]): void {
  for (const slot of slots.splice(0)) slot.unregister();
}

/** What a served model is made of, once its setup has succeeded. */
interface ServedParts {
  options: ModelRuntimeOptions;
  version: string;
  recorder: StatisticsRecorder;
  spec: RequestSpec;
  /** Checks one request (unless the backend checks its own); gives its batch size. */
  check: (request: InferRequest) => number;
  run: RequestsExecutor;
  batcher: DynamicBatcher;
  sequencer: SequenceBatcher | undefined;
  slots: RateLimiterSlot[];
  /** The backend bounds its executions (instances is finite), so requests can queue in the runtime. */
  bounded: boolean;
}

/** A served model's requests on their way: admitted, checked, batched, counted; and its close. */
class ServedModel {
  private readonly name: string;
  private readonly config: ModelConfig;
  private readonly backend: ModelBackend;
  private readonly admission: Admission;
  /** It answers over streams only: infer refuses. */
  private readonly decoupled: boolean;
  /** The server can see a queue: the runtime's (requests can wait in it), or the backend's own. */
  private readonly queueVisible: boolean;
  private closed = false;
  /** Requests admitted and not yet answered. */
  private inflight = 0;

  constructor(private readonly parts: ServedParts) {
    const { options, sequencer, bounded } = parts;
    const { config, backend } = options;
    this.name = config.name;
    this.config = config;
    this.backend = backend;
    this.decoupled = isDecoupled(config) || backend.decoupled === true;
    this.queueVisible = bounded || sequencer !== undefined || backend.pendingRequests !== undefined;
    this.admission = new Admission({
      config,
      ...(options.defaultMaxQueueSize ? { defaultMaxQueueSize: options.defaultMaxQueueSize } : {}),
      level: (priority) => parts.batcher.queueLevel(priority),
      pending: () => (this.queueVisible ? this.queued() : this.inflight),
      inflight: () => this.inflight,
      ...(backend.queueBound ? { backendBound: backend.queueBound.bind(backend) } : {}),
    });
  }

  /** The model as the server sees it. */
  stage(): ModelRuntime {
    const { config, backend } = this;
    const { version, recorder } = this.parts;
    const stage: ModelRuntime = {
      name: this.name,
      version,
      config,
      isReady: () => !this.closed && (backend.isReady?.() ?? true),
      metadata: () => backend.metadata?.() ?? metadataFromConfig(config, [version]),
      infer: (request, opts) => this.infer(request, opts),
      statistics: () => recorder.snapshot(),
      maxQueueSize: () => this.admission.maxQueueSize(),
      close: () => this.close(),
    };
    if (this.queueVisible) stage.pendingRequests = () => this.queued();
    const executeStream = backend.executeStream?.bind(backend);
    if (this.decoupled && executeStream) {
      stage.inferStream = (request, opts) => this.inferStream(executeStream, request, opts);
    }
    return stage;
  }

  /** Requests queued in the runtime, and in the backend when it has a queue of its own. */
  private queued(): number {
    const { batcher, sequencer } = this.parts;
    return batcher.queued + (sequencer?.queued ?? 0) + (this.backend.pendingRequests?.() ?? 0);
  }

  private async infer(request: InferRequest, opts?: InferOptions): Promise<InferResponse> {
    if (this.decoupled) throw decoupledRefusal(this.name);
    this.admitOne(opts?.priority);
    const parts = this.parts;
    try {
      if (parts.spec.emptyBatch && this.config.maxBatchSize > 0 && request.inputs[0]?.shape[0] === 0) {
        const start = nowNs();
        try {
          if (this.closed) throw this.closedError();
          parts.check(request);
          return await this.emptyBatch(request, opts, start);
        } catch (err) {
          parts.recorder.requestFailed(nowNs() - start);
          throw toConnectError(err, this.name);
        }
      }
      return await (parts.sequencer ?? parts.batcher).infer(request, opts);
    } finally {
      this.inflight--;
    }
  }

  /** A decoupled model's responses: one execution per request, however many it sends; it succeeds once the last is sent. */
  private async *inferStream(
    executeStream: NonNullable<ModelBackend["executeStream"]>,
    request: InferRequest,
    opts?: InferOptions,
  ): AsyncGenerator<InferResponse> {
    const { check, recorder } = this.parts;
    this.admitOne(opts?.priority);
    const start = nowNs();
    try {
      if (this.closed) throw this.closedError();
      const size = check(request);
      let first = true;
      for await (const response of executeStream(request, opts)) {
        if (first) recorder.firstResponse(nowNs() - start);
        first = false;
        yield response;
      }
      const { endNs, times } = recorder.ranAlone(start, size);
      traceExecution(opts?.trace, start, start, endNs, times, size);
    } catch (err) {
      recorder.requestFailed(nowNs() - start);
      throw toConnectError(err, this.name);
    } finally {
      this.inflight--;
    }
  }

  private async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.parts.sequencer?.close();
    await this.parts.batcher.close();
    unregister(this.parts.slots);
    await this.backend.close();
  }

  /** Takes a place for one request, or refuses it at once (a full queue), before any work is done on it. */
  private admitOne(priority: number | undefined): void {
    const refused = this.admission.refusal(priority);
    if (refused) {
      this.parts.recorder.requestFailed(0);
      throw refused;
    }
    this.inflight++;
  }

  private closedError(): StageError {
    return new StageError(Code.Unavailable, this.name, "model is unloading");
  }

  /** A request of batch 0 that the spec takes (emptyBatch): answered by the backend at once, not queued. */
  private async emptyBatch(request: InferRequest, opts: InferOptions | undefined, start: number) {
    const { run, recorder, version } = this.parts;
    const result = await run([request], {
      batchSize: 0,
      requests: [request],
      instance: 0,
      ownsInputs: false,
      ...(opts ? { options: opts } : {}),
    });
    const outcome = result.responses[0];
    if (!outcome || outcome instanceof Error) throw toConnectError(outcome ?? "no answer", this.name);
    const { endNs, times } = recorder.ranAlone(start, 0);
    traceExecution(opts?.trace, start, start, endNs, times);
    return { id: request.id, modelName: this.name, modelVersion: version, outputs: outcome } as InferResponse;
  }
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
  // A decoupled backend computes only streams: its batches are never formed (infer refuses).
  if (!backend.execute) return async () => ({ responses: [decoupledRefusal(name)] });
  return mergedExecutor(name, backend.execute.bind(backend), isolation);
}

/**
 * Any Stage as a backend (a pool of worker instances, a stage a module made itself): each
 * batch is one `infer` call of the requests merged; a decoupled stage's `inferStream` is
 * passed through. A stage made by defineStage is served by its definition (definitionBackend),
 * so its requests are recorded once, by the runtime.
 */
export function stageBackend(stage: Stage, instances: number): ModelBackend {
  const definition = definitionOf(stage);
  const backend: ModelBackend = definition
    ? definitionBackend(definition, instances)
    : {
        instances,
        async execute(batch, ctx) {
          const response = await stage.infer(batch, ctx.options);
          return { outputs: response.outputs };
        },
        close: () => stage.close(),
      };
  // What the stage answers itself (a stage spread with its own pendingRequests, say) wins over its definition's.
  backend.isReady = () => stage.isReady();
  backend.metadata = () => stage.metadata();
  backend.close = () => stage.close(); // closing the stage closes its definition once
  if (!definition && stage.inferStream) backend.executeStream = stage.inferStream.bind(stage);
  const pending = stage.pendingRequests?.bind(stage);
  if (pending) backend.pendingRequests = pending;
  return backend;
}

/**
 * What a stage module defines (StageDefinition) as a backend: `execute` answers each request
 * of a batch, `compute` computes the batch merged, `computeStream` sends a decoupled model's
 * responses. Errors are named after the model by the runtime.
 */
export function definitionBackend(definition: StageDefinition, instances: number): ModelBackend {
  const { config } = definition;
  const name = config.name;
  const version = definition.version ?? "1";
  const backend: ModelBackend = {
    // A definition that started its own instances (an ONNX model's sessions) runs no more at once.
    instances: definition.instances ?? instances,
    isReady: () => definition.isReady?.() ?? true,
    metadata: () => definition.metadata?.() ?? metadataFromConfig(config, [version]),
    close: async () => {
      await definition.close?.();
    },
  };
  const { execute, compute, computeStream } = definition;
  if (execute) {
    backend.executeRequests = async (requests, ctx) => ({
      responses: await execute.call(definition, requests, ctx.options),
    });
  } else if (compute) {
    backend.execute = async (batch, ctx) => {
      const execution = { instance: ctx.instance, ownsInputs: ctx.ownsInputs, times: {} };
      const outputs = await compute.call(definition, batch, ctx.options, execution);
      return { outputs, times: execution.times };
    };
  }
  if (computeStream) {
    backend.executeStream = async function* (request, options) {
      for await (const outputs of computeStream.call(definition, request, options)) {
        yield { id: request.id, modelName: name, modelVersion: version, outputs: pickOutputs(name, request, outputs) };
      }
    };
  }
  if (definition.requestSpec) backend.requestSpec = definition.requestSpec;
  if (definition.admit) backend.admit = definition.admit.bind(definition);
  if (definition.pendingRequests) backend.pendingRequests = definition.pendingRequests.bind(definition);
  return backend;
}
