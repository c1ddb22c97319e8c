/**
 * Interceptors: a model's cross-cutting features (tracing, the response cache, classification,
 * shadow mode) as an ordered chain around its scheduler, as connect-es chains a service's
 * interceptors around its handler. Each gets the next step of the chain once, when the model is
 * made, and returns its own; the first in the list is the outermost.
 */
import type { ModelConfig } from "@trellis/protocol";
import type { InferOptions, InferRequest, InferResponse, StatisticsRecorder } from "@trellis/stage";

/** One answer to a request: the model's `infer` at some point of its chain. */
export type InferNext = (request: InferRequest, options?: InferOptions) => Promise<InferResponse>;

/** A decoupled model's answers to a request: its `inferStream` at some point of its chain. */
export type StreamNext = (request: InferRequest, options?: InferOptions) => AsyncIterable<InferResponse>;

/** What an interceptor may know of the model it is part of. */
export interface InterceptedModel {
  readonly name: string;
  readonly version: string;
  readonly config: ModelConfig;
  /** The model's statistics: the one place its requests are counted. */
  readonly recorder: StatisticsRecorder;
}

/** A cross-cutting feature of one model: wraps its one-answer path, its streaming path, or both. */
export interface ModelInterceptor {
  /** What it is ("trace", "cache", "classification", "shadow"), for lookups and logs. */
  readonly name: string;
  infer?(next: InferNext, model: InterceptedModel): InferNext;
  inferStream?(next: StreamNext, model: InterceptedModel): StreamNext;
}

/** `core` with the interceptors around it, the first outermost. */
export function chainInfer(interceptors: readonly ModelInterceptor[], core: InferNext, model: InterceptedModel) {
  let next = core;
  for (let i = interceptors.length - 1; i >= 0; i--) {
    const wrap = interceptors[i]?.infer;
    if (wrap) next = wrap.call(interceptors[i], next, model);
  }
  return next;
}

/** `core` (a decoupled model's stream) with the interceptors around it, the first outermost. */
export function chainStream(interceptors: readonly ModelInterceptor[], core: StreamNext, model: InterceptedModel) {
  let next = core;
  for (let i = interceptors.length - 1; i >= 0; i--) {
    const wrap = interceptors[i]?.inferStream;
    if (wrap) next = wrap.call(interceptors[i], next, model);
  }
  return next;
}
