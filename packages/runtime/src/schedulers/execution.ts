/**
 * What an execution's executor is given and gives back: the contract between a scheduler (the
 * dynamic batcher, the direct one) and a backend's compute (merged along dim 0, or request by
 * request as Triton's `execute(requests)`).
 */
import type { ExecutionTimes, InferOptions, InferRequest, RequestOutcome, Tensor } from "@trellis/stage";

export interface BatchContext {
  /** Items in the batch: the sum of the requests' dim 0 (1 per request when the model does not batch). */
  batchSize: number;
  /** The requests merged into this batch, in order. */
  requests: readonly InferRequest[];
  /** Which execution slot (0 ≤ instance < instances) runs the batch, e.g. which session or worker. */
  instance: number;
  /** True when the batcher allocated the inputs (concatenation), so the executor may transfer or reuse their buffers. */
  ownsInputs: boolean;
  /** A batch of one request: that request's options (its signal, priority), its trace left to the batcher. */
  options?: InferOptions;
}

/**
 * What an executor measured itself; anything missing counts as compute_infer. `queueNs`: time
 * the request waited inside the backend (an ensemble's steps' queues), added to its queue time.
 */
export type ReportedTimes = Partial<ExecutionTimes> & { queueNs?: number };

export interface BatchResult {
  /** Every output the batch asked for (or all), with dim 0 = batchSize when the model batches. */
  outputs: Tensor[];
  times?: ReportedTimes;
}

/** Each request's answer to one execution, in `context.requests` order (Triton's `execute(requests)`). */
export interface RequestsResult {
  responses: RequestOutcome[];
  times?: ReportedTimes;
}

/**
 * An execution's times: what its executor reported, the rest from the clock (`t0` it started, `t1`
 * its executor returned, `t2` its answers were made): unreported compute counts as compute_infer,
 * making the answers as compute_output.
 */
export function executionTimes(t0: number, t1: number, t2: number, reported: ReportedTimes = {}): ExecutionTimes {
  return {
    computeInputNs: reported.computeInputNs ?? 0,
    computeInferNs:
      reported.computeInferNs ?? t1 - t0 - (reported.computeInputNs ?? 0) - (reported.computeOutputNs ?? 0),
    computeOutputNs: t2 - t1 + (reported.computeOutputNs ?? 0),
  };
}

/** Computes a batch merged along dim 0: one result for all its requests (a throw fails the execution). */
export type BatchExecutor = (batch: InferRequest, context: BatchContext) => Promise<BatchResult>;
/** Computes a batch's requests as they are and answers each: its outputs, or an error of its own. */
export type RequestsExecutor = (requests: readonly InferRequest[], context: BatchContext) => Promise<RequestsResult>;

/** A backend's options without the request's trace (only one that stamps its own steps gets it). */
export function withoutTrace({ trace: _trace, ...rest }: InferOptions): InferOptions {
  return rest;
}
