/**
 * Model: one loaded version of a model, the one object the server holds for it (Triton's
 * `Model`). It implements Stage. A request comes in, is counted in flight (its hold on this
 * version: an unload or reload waits for it), passes the model's interceptors (tracing, cache,
 * classification, shadow: interceptors/), and reaches the core: admission (the queue bound),
 * the checks against config.pbtxt, and the scheduler its config chooses (schedulers/: sequence,
 * dynamic with or without batching, or direct for an ensemble or a remote model), which runs the
 * backend on an instance. Statistics are recorded once, in its recorder.
 */
import type { ModelConfig, ModelStatistics } from "@trellis/protocol";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  isDecoupled,
  metadataFromConfig,
  nowNs,
  StageError,
  type StageMetadata,
  type StatisticsRecorder,
  traceExecution,
} from "@trellis/stage";
import { decoupledRefusal, type RateLimiterSlot, type RequestSpec, toConnectError } from "@trellis/stage/backend";
import { Admission } from "./admission.js";
import type { ModelBackend } from "./backend.js";
import {
  chainInfer,
  chainStream,
  type InferNext,
  type InterceptedModel,
  type ModelInterceptor,
  type StreamNext,
} from "./interceptors/chain.js";
import type { RequestsExecutor } from "./schedulers/execution.js";
import type { Scheduler } from "./schedulers/scheduler.js";
import type { SequenceBatcher } from "./schedulers/sequence/batcher.js";

/** What a model is made of, once its setup has succeeded (see createModel). */
export interface ModelParts {
  config: ModelConfig;
  version: string;
  backend: ModelBackend;
  recorder: StatisticsRecorder;
  spec: RequestSpec;
  /** Checks one request (unless the backend checks its own); gives its batch size. */
  check: (request: InferRequest) => number;
  run: RequestsExecutor;
  /** The scheduler its config chooses (schedulers/scheduler.ts); a sequence model's sequencer sits in front of it. */
  scheduler: Scheduler;
  sequencer: SequenceBatcher | undefined;
  slots: RateLimiterSlot[];
  /** The backend bounds its executions (instances is finite), so requests can queue in the runtime. */
  bounded: boolean;
  /** The server's queue bound for a config that sets no max_queue_size; 0: none. */
  defaultMaxQueueSize?: number;
  /** Cross-cutting features, in order, the first outermost. */
  interceptors?: readonly ModelInterceptor[];
  /** Every version of this model being served, for metadata (Triton lists them all); default: this one. */
  versions?: () => string[];
}

/** Gives each instance's place in the rate limiter back. */
export function unregister(slots: RateLimiterSlot[]): void {
  for (const slot of slots.splice(0)) slot.unregister();
}

export class Model {
  readonly name: string;
  readonly version: string;
  readonly config: ModelConfig;
  /** A decoupled model's answers (present only for one): each response as it is sent. */
  readonly inferStream?: (request: InferRequest, options?: InferOptions) => AsyncIterable<InferResponse>;
  /** Requests waiting in its queues (present when it has one the server can see). */
  readonly pendingRequests?: () => number;
  private readonly backend: ModelBackend;
  private readonly admission: Admission;
  private readonly interceptors: readonly ModelInterceptor[];
  private readonly answer: InferNext;
  /** It answers over streams only: infer refuses. */
  private readonly decoupled: boolean;
  /** The server can see a queue: the runtime's (requests can wait in it), or the backend's own. */
  private readonly queueVisible: boolean;
  private closed = false;
  /** Requests admitted by the scheduler's admission and not yet answered. */
  private admitted = 0;
  /** Requests holding this version (in flight, or an ensemble's request holding its step). */
  private holds = 0;
  /** Holds of requests not at the model yet (reserve): counted for draining, not in `inflight`. */
  private reservations = 0;
  private idleWaiters: (() => void)[] = [];

  private readonly parts: ModelParts;

  /**
   * @internal Made only by createModel, which sets its parts up and passes them here. The argument
   * is typed `never` so that what a Model is made of stays out of the public API: no one else can
   * construct one.
   */
  constructor(setup: never) {
    const parts: ModelParts = setup;
    this.parts = parts;
    const { config, backend, sequencer, bounded, version } = parts;
    this.name = config.name;
    this.version = version;
    this.config = config;
    this.backend = backend;
    this.interceptors = parts.interceptors ?? [];
    this.decoupled = isDecoupled(config) || backend.decoupled === true;
    this.queueVisible = bounded || sequencer !== undefined || backend.pendingRequests !== undefined;
    this.admission = new Admission({
      config,
      ...(parts.defaultMaxQueueSize ? { defaultMaxQueueSize: parts.defaultMaxQueueSize } : {}),
      level: (priority) => parts.scheduler.queueLevel(priority),
      pending: () => (this.queueVisible ? this.queued() : this.admitted),
      inflight: () => this.admitted,
      ...(backend.queueBound ? { backendBound: backend.queueBound.bind(backend) } : {}),
    });
    const self: InterceptedModel = { name: this.name, version, config, recorder: parts.recorder };
    this.answer = chainInfer(this.interceptors, (request, options) => this.schedule(request, options), self);
    if (this.queueVisible) this.pendingRequests = () => this.queued();
    const executeStream = backend.executeStream?.bind(backend);
    if (this.decoupled && executeStream) {
      const stream = chainStream(this.interceptors, (r, o) => this.scheduleStream(executeStream, r, o), self);
      this.inferStream = (request, options) => this.held(stream, request, options);
    }
  }

  // The Stage members are own properties, as a plain Stage object's are: `{ ...model, infer }`
  // (a wrapper spreading the model) keeps them all.
  readonly isReady = (): boolean | Promise<boolean> => !this.closed && (this.backend.isReady?.() ?? true);

  readonly metadata = async (): Promise<StageMetadata> => {
    const md = await (this.backend.metadata?.() ?? metadataFromConfig(this.config, [this.version]));
    const versions = this.parts.versions?.();
    return versions && versions.length > 0 ? { ...md, versions } : md;
  };

  readonly statistics = (): ModelStatistics => this.parts.recorder.snapshot();

  /** The most requests it holds pending before refusing more (0: unbounded). */
  readonly maxQueueSize = (): number => this.admission.maxQueueSize();

  /** The interceptor of that name in its chain (e.g. "shadow", for its report), if it has one. */
  interceptor(name: string): ModelInterceptor | undefined {
    return this.interceptors.find((i) => i.name === name);
  }

  readonly infer = async (request: InferRequest, options?: InferOptions): Promise<InferResponse> => {
    // Every frontend's one-answer call (HTTP, gRPC ModelInfer, SageMaker, Vertex AI) is refused alike.
    if (this.decoupled) throw decoupledRefusal(this.name);
    const release = this.hold();
    try {
      return await this.answer(request, options);
    } finally {
      release();
    }
  };

  /**
   * A hold on this version for one request (Triton's model handle): until it is released, an
   * unload or reload of the version waits for it (drained). Refused once the model is closed.
   */
  hold(): () => void {
    return this.take(false);
  }

  /**
   * A hold for a request that has not reached the model yet (its body still arriving at the
   * frontend): an unload or reload waits for it as for any hold, but it is not counted in
   * `inflight` (the request's `infer` counts it once it runs).
   */
  reserve(): () => void {
    return this.take(true);
  }

  private take(reservation: boolean): () => void {
    if (this.closed) throw this.closedError();
    this.holds++;
    if (reservation) this.reservations++;
    let held = true;
    return () => {
      if (!held) return;
      held = false;
      this.holds--;
      if (reservation) this.reservations--;
      if (this.holds === 0) this.wakeIdle();
    };
  }

  /** Requests holding this version now: in flight here, or an ensemble's request holding it as its step. */
  get inflight(): number {
    return this.holds - this.reservations;
  }

  /** Resolves once no request holds this version. */
  drained(): Promise<void> {
    if (this.holds === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  readonly close = async (): Promise<void> => {
    if (this.closed) return;
    this.closed = true;
    this.parts.sequencer?.close();
    await this.parts.scheduler.close();
    unregister(this.parts.slots);
    await this.backend.close();
  };

  private wakeIdle(): void {
    const waiters = this.idleWaiters;
    this.idleWaiters = [];
    for (const w of waiters) w();
  }

  /** A stream counted as holding this version until its last answer (or until its reader stops). */
  private async *held(stream: StreamNext, request: InferRequest, options?: InferOptions) {
    const release = this.hold();
    try {
      yield* stream(request, options);
    } finally {
      release();
    }
  }

  /** Requests queued in the runtime, and in the backend when it has a queue of its own. */
  private queued(): number {
    const { scheduler, sequencer } = this.parts;
    return scheduler.queued + (sequencer?.queued ?? 0) + (this.backend.pendingRequests?.() ?? 0);
  }

  /** The core of the chain: admitted, checked and run by the scheduler the config chooses. */
  private async schedule(request: InferRequest, opts?: InferOptions): Promise<InferResponse> {
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
      return await (parts.sequencer ?? parts.scheduler).infer(request, opts);
    } finally {
      this.admitted--;
    }
  }

  /** A decoupled model's responses: one execution per request, however many it sends; it succeeds once the last is sent. */
  private async *scheduleStream(
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
      this.admitted--;
    }
  }

  /** Takes a place for one request, or refuses it at once (a full queue), before any work is done on it. */
  private admitOne(priority: number | undefined): void {
    const refused = this.admission.refusal(priority);
    if (refused) {
      this.parts.recorder.requestFailed(0);
      throw refused;
    }
    this.admitted++;
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
