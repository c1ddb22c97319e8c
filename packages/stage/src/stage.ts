/**
 * The one contract every Trellis stage implements, whether it runs in this
 * process (preprocess, ONNX, an ensemble) or behind KServe v2 gRPC.
 */
import type { ModelConfig, ModelStatistics } from "@trellis/protocol";
import { Code, StageError } from "./errors.js";
import type { CpuGate, RateLimiter } from "./instances.js";
import type { DataType, Tensor } from "./tensor.js";
import type { RequestTrace } from "./trace.js";

/** A request or tensor parameter, as KServe v2's InferParameter carries it. */
export type ParameterValue = string | number | boolean | bigint;
export type Parameters = Record<string, ParameterValue>;

export interface RequestedOutput {
  name: string;
  /** Triton's classification extension: `classification` = k asks for top-k "score:index:label". */
  parameters?: Parameters;
}

export interface InferRequest {
  id?: string;
  inputs: Tensor[];
  /** Outputs wanted; absent or empty means every output. */
  outputs?: RequestedOutput[];
  parameters?: Parameters;
}

export interface InferResponse {
  id?: string;
  modelName: string;
  modelVersion: string;
  outputs: Tensor[];
  parameters?: Parameters;
}

export interface InferOptions {
  /** Aborts the request: cancellation and deadlines both arrive this way. */
  signal?: AbortSignal;
  /** Request priority level, 1 = highest, as Triton's dynamic batcher counts. */
  priority?: number;
  /** Overrides the queue policy's default timeout for this request. */
  timeoutMicroseconds?: number;
  /** Present when the request is traced (Triton's trace extension): the stage stamps its part on it. */
  trace?: RequestTrace;
}

export interface TensorMetadata {
  name: string;
  datatype: DataType;
  /** Full shape including the batch dimension (-1) when the model batches. */
  shape: number[];
}

export interface StageMetadata {
  name: string;
  versions: string[];
  platform: string;
  inputs: TensorMetadata[];
  outputs: TensorMetadata[];
}

export interface Stage {
  /** Model name, as clients address it. */
  readonly name: string;
  /** Version being served, e.g. "1". */
  readonly version: string;
  /** The configuration the stage was built from (config.pbtxt is the source of truth). */
  readonly config: ModelConfig;
  /** True once loaded and warmed up. */
  isReady(): boolean | Promise<boolean>;
  metadata(): StageMetadata | Promise<StageMetadata>;
  infer(request: InferRequest, options?: InferOptions): Promise<InferResponse>;
  /**
   * A decoupled model's responses to one request (its config sets model_transaction_policy
   * { decoupled: true }): any number of them, in order, as the model sends them; the request
   * is done when the iteration ends. Only decoupled stages have it, and their `infer` refuses
   * (UNIMPLEMENTED): clients reach them over ModelStreamInfer, as Triton's do.
   */
  inferStream?(request: InferRequest, options?: InferOptions): AsyncIterable<InferResponse>;
  statistics(): ModelStatistics | Promise<ModelStatistics>;
  /**
   * Requests accepted but not yet executing: waiting for an instance or a
   * batch (Triton's pending-request count). Stages without a queue of their
   * own leave it out; the server then counts the requests in flight, as Triton
   * does for ensembles.
   */
  pendingRequests?(): number;
  /**
   * The most requests it holds pending (as pendingRequests counts them) before it refuses
   * more, UNAVAILABLE as Triton's full queue; 0 or absent: unbounded (or bounded by its
   * config's max_queue_size alone). An ensemble admits no more requests at once than its
   * tightest step's bound, so a later step never refuses what an earlier one computed.
   */
  maxQueueSize?(): number;
  /** Releases sessions, workers and connections. */
  close(): Promise<void>;
}

/** A stage's answers to one request: a decoupled stage's responses (inferStream), else its one answer. */
export async function* answersOf(
  stage: Stage,
  request: InferRequest,
  options?: InferOptions,
): AsyncGenerator<InferResponse> {
  if (stage.inferStream) yield* stage.inferStream(request, options);
  else yield await stage.infer(request, options);
}

/** What a decoupled stage's `infer` answers: its responses come over a stream, not one per call. */
export function decoupledRefusal(model: string): StageError {
  return new StageError(
    Code.Unimplemented,
    model,
    "the model is decoupled (model_transaction_policy): it sends its responses over the ModelStreamInfer stream, not one per call",
  );
}

/**
 * What a stage factory receives: the parsed config.pbtxt and where the model
 * lives. Every stage package exports `createStage(options)` with this
 * signature, which is how a repository's `backend: "typescript"` models
 * (and users' own model.js files) are loaded.
 */
export interface StageFactoryOptions {
  config: ModelConfig;
  /** `<repository>/<model>` */
  modelDir: string;
  /** The version being loaded, e.g. "1". */
  version: string;
  /** `<repository>/<model>/<version>`: weights, labels and the like. */
  versionDir: string;
  /** Optional structured logger (pino-compatible subset). */
  logger?: StageLogger;
  /** The server's rate limiter (--rate-limit execution_count): a stage with instances admits their runs through it. */
  rateLimiter?: RateLimiter;
  /** The server's CPU gate, for a stage whose work competes with runs that take every core; absent: ungated. */
  cpuGate?: CpuGate;
  /** The server's models, for a stage that calls others as it runs (Triton's business logic scripting). */
  models?: ModelCaller;
}

export interface StageLogger {
  info(obj: object | string, msg?: string): void;
  warn(obj: object | string, msg?: string): void;
  error(obj: object | string, msg?: string): void;
}

export interface ModelCallOptions extends InferOptions {
  /** The version to run; default: the latest ready one. */
  version?: string;
}

export interface ModelCaller {
  /** `model`'s answer to `request` (a decoupled model refuses: use inferStream). */
  infer(model: string, request: InferRequest, options?: ModelCallOptions): Promise<InferResponse>;
  /** `model`'s responses to `request` as they come: any number for a decoupled model, else its one answer. */
  inferStream(model: string, request: InferRequest, options?: ModelCallOptions): AsyncIterable<InferResponse>;
  /** Whether `model` (that version, if given) is loaded and ready (`pb_utils.is_model_ready`). */
  isReady(model: string, version?: string): Promise<boolean>;
}
