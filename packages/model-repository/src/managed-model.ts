/**
 * ManagedStage (deprecated: the repository now serves each loaded version as one Model of
 * @trellis/runtime, its features as interceptors): how the repository manager handed a loaded
 * stage to the frontends. It counts in-flight requests (for graceful unload and shutdown,
 * and the pending-request metric of stages without a queue of their own),
 * applies the response cache, and implements Triton's classification
 * extension, so HTTP and gRPC behave the same without each stage knowing.
 * The queue bound is the model runtime's admission (every model has one).
 */
import { clone, create } from "@bufbuild/protobuf";
import {
  InferStatisticsSchema,
  type ModelConfig,
  type ModelStatistics,
  ModelStatisticsSchema,
  StatisticDurationSchema,
} from "@trellis/protocol";
import {
  classificationInterceptor,
  type InferNext,
  type ModelCache,
  responseCacheKey,
  type StreamNext,
} from "@trellis/runtime";
import {
  type InferOptions,
  type InferRequest,
  type InferResponse,
  nowNs,
  type RequestTrace,
  type Stage,
  type StageMetadata,
  StatisticsRecorder,
} from "@trellis/stage";
import { decoupledRefusal } from "@trellis/stage/backend";
import type { ShadowAgreement, ShadowComparer } from "./shadow.js";

/**
 * The queue bound of a model whose config sets no max_queue_size (--default-max-queue-size,
 * applied by the model runtime's admission):
 * enough to keep a model's instances fed with full batches, and a few hundred MB at most of
 * decoded images waiting in the seed's pipeline, instead of a queue that grows until memory runs out.
 */
export const DEFAULT_MAX_QUEUE_SIZE = 128;

export type { ModelCache } from "@trellis/runtime";
export { classification } from "@trellis/runtime";

/**
 * A stage with the in-flight count, response cache, classification and shadow mode around it.
 * @deprecated the repository serves each loaded version as a `Model` (`@trellis/runtime`'s
 * createModel), these features as its interceptors: `tracingInterceptor`, `cacheInterceptor`,
 * `classificationInterceptor`, `shadowInterceptor`. Kept working for code that made its own.
 */
export class ManagedStage implements Stage {
  private inflightCount = 0;
  private idleWaiters: (() => void)[] = [];
  private readonly cacheHits = { count: 0, ns: 0 };
  private readonly cacheMisses = { count: 0, ns: 0 };

  /**
   * @param labels class labels per output name (from config `label_filename`), for classification.
   * @param cache the response cache, when the server has one and the model's config enables it.
   */
  /** A decoupled model's responses (the inner stage's), counted in flight until the last; absent for other models. */
  readonly inferStream?: (request: InferRequest, options?: InferOptions) => AsyncIterable<InferResponse>;

  constructor(
    readonly inner: Stage,
    labels: ReadonlyMap<string, string[]> = new Map(),
    /** Every version of this model being served, for metadata (Triton lists them all). */
    private readonly versions?: () => string[],
    private readonly cache?: ModelCache,
    /** Shadow mode (config `shadow_model`): a sample of requests also sent to that model, answers compared. */
    private readonly shadow?: ShadowComparer,
  ) {
    // Classification is the runtime's one formatter, used through its interceptor.
    const classifying = classificationInterceptor(labels);
    const model = {
      name: inner.name,
      version: inner.version,
      config: inner.config,
      recorder: new StatisticsRecorder(inner.name, inner.version, false),
    };
    this.classifiedRun = classifying.infer?.((r, o) => this.runInner(r, o), model) as InferNext;
    const innerStream = inner.inferStream?.bind(inner);
    if (innerStream) {
      this.classifiedStream = classifying.inferStream?.(innerStream, model) as StreamNext;
      this.inferStream = (request, options) => this.stream(request, options);
    }
  }

  private readonly classifiedRun: InferNext;
  private readonly classifiedStream?: StreamNext;

  get name(): string {
    return this.inner.name;
  }
  get version(): string {
    return this.inner.version;
  }
  get config(): ModelConfig {
    return this.inner.config;
  }
  /** Requests this stage is executing right now. */
  get inflight(): number {
    return this.inflightCount;
  }
  /** Requests waiting to execute (the stage's own queue), else those in flight, as Triton counts ensembles. */
  pendingRequests(): number {
    return this.inner.pendingRequests?.() ?? this.inflightCount;
  }

  /** The most requests this model holds pending before refusing more (0: unbounded): its runtime's. */
  maxQueueSize(): number {
    return this.inner.maxQueueSize?.() ?? 0;
  }

  isReady(): boolean | Promise<boolean> {
    return this.inner.isReady();
  }
  async metadata(): Promise<StageMetadata> {
    const md = await this.inner.metadata();
    const versions = this.versions?.();
    return versions && versions.length > 0 ? { ...md, versions } : md;
  }
  /**
   * The inner stage's statistics, plus the cache's as Triton counts them: a hit is a
   * successful request (and its time a success's), with no execution or inference behind it.
   */
  async statistics(): Promise<ModelStatistics> {
    const inner = await this.inner.statistics();
    if (!this.cache) return inner;
    const s = clone(ModelStatisticsSchema, inner);
    const stats = s.inferenceStats ?? create(InferStatisticsSchema);
    const duration = ({ count, ns }: { count: number; ns: number }) =>
      create(StatisticDurationSchema, { count: BigInt(count), ns: BigInt(Math.round(ns)) });
    const success = stats.success ?? create(StatisticDurationSchema);
    stats.cacheHit = duration(this.cacheHits);
    stats.cacheMiss = duration(this.cacheMisses);
    success.count += stats.cacheHit.count;
    success.ns += stats.cacheHit.ns;
    stats.success = success;
    s.inferenceStats = stats;
    return s;
  }

  async infer(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
    // Every frontend's one-answer call (HTTP, gRPC ModelInfer, SageMaker, Vertex AI) is refused alike.
    if (this.inferStream) throw decoupledRefusal(this.name);
    const trace = options?.trace;
    if (!trace) return this.answer(request, options);
    traceRequestStart(trace, request);
    try {
      return traceOutputs(trace, await this.answer(request, options));
    } finally {
      trace.stamp("REQUEST_END", nowNs());
    }
  }

  private async *stream(request: InferRequest, options?: InferOptions): AsyncGenerator<InferResponse> {
    const trace = options?.trace;
    if (trace) traceRequestStart(trace, request);
    this.started();
    try {
      for await (const answer of (this.classifiedStream as StreamNext)(request, options)) {
        yield trace ? traceOutputs(trace, answer) : answer;
      }
    } finally {
      trace?.stamp("REQUEST_END", nowNs());
      this.finished();
    }
  }

  private started(): void {
    this.inflightCount++;
  }

  private finished(): void {
    this.inflightCount--;
    if (this.inflightCount === 0) {
      const waiters = this.idleWaiters;
      this.idleWaiters = [];
      for (const w of waiters) w();
    }
  }

  /**
   * From the response cache when it holds the answer, else by running the stage. The request
   * counts as in flight from here, a shared cache's round trip included, so an unload waits for it.
   */
  private async answer(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
    this.started();
    try {
      if (!this.cache) return await this.run(request, options);
      const { store, scope } = this.cache;
      const started = nowNs();
      const key = responseCacheKey(scope, request);
      const hit = await store.lookup(key, request);
      if (hit) {
        this.cacheHits.count++;
        this.cacheHits.ns += nowNs() - started;
        return hit;
      }
      const lookupNs = nowNs() - started;
      const response = await this.run(request, options);
      const inserting = nowNs();
      await store.insert(key, response);
      // Triton's cache-miss time: the lookup plus the insertion, not the execution between them.
      this.cacheMisses.count++;
      this.cacheMisses.ns += lookupNs + (nowNs() - inserting);
      return response;
    } finally {
      this.finished();
    }
  }

  private run(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
    return this.classifiedRun(request, options);
  }

  private runInner(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
    // Copied before the model runs: it may take the request's input buffers over.
    const shadowCopy = this.shadow?.sample(request);
    // After the cache lookup, as Triton's: a cached answer is served even while the queue is full.
    const answer = this.inner.infer(request, options);
    if (shadowCopy) this.shadow?.compare(shadowCopy, answer);
    return answer;
  }

  /** The running agreement with the model named by config `shadow_model`, when it names one. */
  shadowAgreement(): ShadowAgreement | undefined {
    return this.shadow?.report();
  }

  /** Resolves once no request is in flight. */
  drained(): Promise<void> {
    if (this.inflightCount === 0) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}

/** A traced request's start: its timestamp and (trace level TENSORS) its inputs as queued. */
function traceRequestStart(trace: RequestTrace, request: InferRequest): void {
  trace.stamp("REQUEST_START", nowNs());
  for (const input of request.inputs) trace.tensor("TENSOR_QUEUE_INPUT", input);
}

/** A traced response's outputs as the model gave them; returns the response. */
function traceOutputs(trace: RequestTrace, response: InferResponse): InferResponse {
  for (const output of response.outputs) trace.tensor("TENSOR_BACKEND_OUTPUT", output);
  return response;
}
