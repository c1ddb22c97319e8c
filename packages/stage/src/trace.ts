/**
 * Triton's request tracing (the trace extension, trace levels TIMESTAMPS and
 * TENSORS): what a traced request carries through the stages, and what a server
 * supplies to sample requests and keep the settings. A stage records its
 * part through `traceExecution`, from the times its statistics already take;
 * the server records each model's input and output tensors.
 */
import type { ExecutionTimes } from "./statistics.js";
import type { Tensor } from "./tensor.js";

/** Triton's timestamp names, in the order a request meets them. */
export type TraceActivity =
  | "HTTP_RECV_START"
  | "HTTP_RECV_END"
  | "GRPC_WAITREAD_START"
  | "GRPC_WAITREAD_END"
  | "REQUEST_START"
  | "QUEUE_START"
  | "COMPUTE_START"
  | "COMPUTE_INPUT_END"
  | "COMPUTE_OUTPUT_START"
  | "COMPUTE_END"
  | "REQUEST_END"
  | "HTTP_SEND_START"
  | "HTTP_SEND_END"
  | "GRPC_SEND_START"
  | "GRPC_SEND_END";

/** Triton's names for a traced tensor: a model's input as it is queued, and its output as the model gave it. */
export type TensorActivity = "TENSOR_QUEUE_INPUT" | "TENSOR_BACKEND_OUTPUT";

/** One sampled request's trace. Timestamps are on nowNs's clock (monotonic ns, as Triton's steady clock). */
export interface RequestTrace {
  /** Records `activity` at `ns` (default: now); nothing when the trace level leaves timestamps out. */
  stamp(activity: TraceActivity, ns?: number): void;
  /** Records a tensor (trace level TENSORS); nothing when the trace level leaves tensors out. */
  tensor(activity: TensorActivity, tensor: Tensor): void;
  /** The trace of a request this one makes to another model (an ensemble step), linked by parent_id. */
  child(model: string, version: string): RequestTrace;
  /** The request is answered: the trace (with its children) is collected. A child's end does nothing. */
  end(): void;
  /** This request (an ensemble step) failed: the waterfall shows it in red. */
  failed?(): void;
  /** The number of items in the batch the request's execution ran in (a server keeping recent traces shows it). */
  batchSize?(size: number): void;
  /**
   * Headers a call to a remote Trellis step carries so the remote traces it too and sends its
   * timestamps back (W3C traceparent and the on-demand ask); undefined when the trace has none.
   */
  remoteHeaders?(): Record<string, string> | undefined;
  /** The remote step's own trace, as its server sent it back (`remoteTraceReply`). */
  remote?(reply: string): void;
  /**
   * This trace as the caller asked for it back (the request carried the on-demand ask from another
   * Trellis server), once the request is answered; undefined when it was not asked for.
   */
  reply?(): string | undefined;
}

/** The response parameter a Trellis server sends its trace back in, when a calling Trellis server asked for it. */
export const TRACE_REPLY_PARAMETER = "trellis_trace";

/**
 * Stamps a finished execution on `trace`: queued at `queueStartNs`, executed from
 * `computeStartNs` to `endNs`, with the compute input and output spans of `times`
 * (the same figures the stage gives its statistics).
 */
export function traceExecution(
  trace: RequestTrace | undefined,
  queueStartNs: number,
  computeStartNs: number,
  endNs: number,
  times: ExecutionTimes,
  batchSize?: number,
): void {
  if (!trace) return;
  if (batchSize !== undefined) trace.batchSize?.(batchSize);
  trace.stamp("QUEUE_START", queueStartNs);
  trace.stamp("COMPUTE_START", computeStartNs);
  trace.stamp("COMPUTE_INPUT_END", computeStartNs + times.computeInputNs);
  trace.stamp("COMPUTE_OUTPUT_START", endNs - times.computeOutputNs);
  trace.stamp("COMPUTE_END", endNs);
}
