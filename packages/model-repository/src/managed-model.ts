/**
 * ManagedStage: how the repository manager hands a loaded stage to the
 * frontends. It counts in-flight requests (for graceful unload and shutdown,
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
import { type ResponseStore, responseCacheKey } from "@trellis/runtime";
import {
  Code,
  datatypeFromConfig,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  nowNs,
  type RequestedOutput,
  type RequestTrace,
  type Stage,
  StageError,
  type StageMetadata,
  type Tensor,
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

/** The response cache a model uses, and the scope its keys are made in (model, version, which load). */
export interface ModelCache {
  store: ResponseStore;
  scope: string;
}

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
    private readonly labels: ReadonlyMap<string, string[]> = new Map(),
    /** Every version of this model being served, for metadata (Triton lists them all). */
    private readonly versions?: () => string[],
    private readonly cache?: ModelCache,
    /** Shadow mode (config `shadow_model`): a sample of requests also sent to that model, answers compared. */
    private readonly shadow?: ShadowComparer,
  ) {
    if (inner.inferStream) this.inferStream = (request, options) => this.stream(request, options);
  }

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
    const classify = classificationRequests(this.name, request.outputs, this.config);
    this.started();
    try {
      for await (const response of (this.inner.inferStream as NonNullable<Stage["inferStream"]>)(request, options)) {
        const answer = this.classified(response, classify);
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

  private async run(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
    const classify = classificationRequests(this.name, request.outputs, this.config);
    // Copied before the model runs: it may take the request's input buffers over.
    const shadowCopy = this.shadow?.sample(request);
    // After the cache lookup, as Triton's: a cached answer is served even while the queue is full.
    const answer = this.inner.infer(request, options);
    if (shadowCopy) this.shadow?.compare(shadowCopy, answer);
    return this.classified(await answer, classify);
  }

  /** The running agreement with the model named by config `shadow_model`, when it names one. */
  shadowAgreement(): ShadowAgreement | undefined {
    return this.shadow?.report();
  }

  /**
   * The response with the outputs `classify` names as Triton's classification. The request went
   * through unchanged, and the output the stage answers with is what is classified, as Triton's
   * frontend does (src/classification.cc): a BYTES output is refused (see classification).
   */
  private classified(response: InferResponse, classify: Map<string, number>): InferResponse {
    if (classify.size === 0) return response;
    const batched = this.config.maxBatchSize > 0;
    return {
      ...response,
      outputs: response.outputs.map((t) => {
        const k = classify.get(t.name);
        if (k === undefined) return t;
        return classification(this.name, t, k, batched, this.labels.get(t.name));
      }),
    };
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

/**
 * Output name -> k for each requested output carrying the `classification` parameter; refused
 * before the model runs when the config gives the output a type Triton cannot classify.
 */
function classificationRequests(
  model: string,
  outputs: RequestedOutput[] | undefined,
  config: ModelConfig,
): Map<string, number> {
  const classify = new Map<string, number>();
  for (const o of outputs ?? []) {
    const k = o.parameters?.classification;
    if (k === undefined) continue;
    const count = Number(k);
    if (!Number.isInteger(count) || count < 1) {
      throw new StageError(
        Code.InvalidArgument,
        model,
        `output ${o.name}: classification must be a positive integer, got ${String(k)}`,
      );
    }
    const declared = config.output.find((c) => c.name === o.name);
    // TYPE_INVALID (0): a config that does not say; the answer's type is checked then.
    if (declared?.dataType) {
      const datatype = datatypeFromConfig(declared.dataType);
      if (UNCLASSIFIABLE.has(datatype)) throw unclassifiable(model, o.name, datatype);
    }
    classify.set(o.name, count);
  }
  return classify;
}

/** Types Triton's classification refuses (src/classification.cc TopkClassifications). */
const UNCLASSIFIABLE = new Set(["BYTES", "BOOL", "FP16", "BF16"]);

/** Triton's refusal of classification on an output of `datatype`, naming the output after Triton's words. */
const unclassifiable = (model: string, output: string, datatype: string) =>
  new StageError(
    Code.InvalidArgument,
    model,
    `class result not available for output due to unsupported type '${datatype}' (output '${output}')`,
  );

const encoder = new TextEncoder();

/**
 * Triton's classification output: per batch item the top-k classes as
 * "score:index[:label]" strings (score printed like C++ std::to_string),
 * shape [batch, k] (or [k] for a model without batching).
 */
export function classification(
  model: string,
  t: Tensor,
  k: number,
  batched: boolean,
  labels: string[] | undefined,
): Tensor {
  if (UNCLASSIFIABLE.has(t.datatype)) throw unclassifiable(model, t.name, t.datatype);
  const values = t.data as ArrayLike<number | bigint>;
  const items = batched ? (t.shape[0] ?? 1) : 1;
  const classes = items === 0 ? 0 : values.length / items;
  const topk = Math.min(k, classes);
  const out: Uint8Array[] = [];
  for (let b = 0; b < items; b++) {
    const base = b * classes;
    const order = Array.from({ length: classes }, (_, i) => i);
    order.sort((i, j) => Number(values[base + j]) - Number(values[base + i]) || i - j);
    for (const index of order.slice(0, topk)) {
      const score = Number(values[base + index]).toFixed(6);
      const label = labels?.[index];
      out.push(encoder.encode(label !== undefined ? `${score}:${index}:${label}` : `${score}:${index}`));
    }
  }
  return { name: t.name, datatype: "BYTES", shape: batched ? [items, topk] : [topk], data: out };
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
