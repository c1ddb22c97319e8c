/**
 * Triton's request tracing (the trace extension, trace levels TIMESTAMPS and
 * TENSORS): what a traced request carries through the stages, and what a server
 * supplies to sample requests and keep the settings. A stage records its
 * part through `traceExecution`, from the times its statistics already take;
 * the server records each model's input and output tensors.
 */
import { Code, StageError } from "./errors.js";
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
}

/** Trace settings as the trace extension names them; trace_level is a list, the rest single strings. */
export type TraceSettings = Record<string, string | string[]>;

/** What a server supplies to trace requests and answer TraceSetting (GET/POST v2[/models/m]/trace/setting). */
export interface TraceControl {
  /** The settings in force for `model` (its own where it has some, else the global ones). */
  settings(model?: string): TraceSettings;
  /**
   * Applies `changes` all or none (an empty list clears a setting: a model's back to the
   * global value, a global one back to its value at start); throws a StageError naming the
   * first bad one. Returns the settings in force afterwards.
   */
  update(model: string | undefined, changes: Record<string, string[]>): TraceSettings;
  /**
   * A trace for one request to `model`, when the settings sample it; undefined otherwise.
   * `header` reads the request's headers (gRPC metadata included): a W3C traceparent
   * there continues the caller's trace, in OpenTelemetry mode.
   */
  begin(
    model: string,
    version: string,
    requestId?: string,
    header?: (name: string) => string | undefined,
  ): RequestTrace | undefined;
}

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
): void {
  if (!trace) return;
  trace.stamp("QUEUE_START", queueStartNs);
  trace.stamp("COMPUTE_START", computeStartNs);
  trace.stamp("COMPUTE_INPUT_END", computeStartNs + times.computeInputNs);
  trace.stamp("COMPUTE_OUTPUT_START", endNs - times.computeOutputNs);
  trace.stamp("COMPUTE_END", endNs);
}

/**
 * A TraceSetting call: a read when `changes` is empty, else an update; without a control only OFF
 * is answered. A model's settings are for a model `registry` serves (NOT_FOUND otherwise: a typo
 * would be kept, and trace nothing).
 */
export function answerTraceSettings(
  control: TraceControl | undefined,
  model: string | undefined,
  changes: Record<string, string[]>,
  // A ModelRegistry's resolve (throws NOT_FOUND for a model it does not serve); typed here so trace.ts needs no registry.
  registry?: { resolve(name: string, version?: string): unknown },
): TraceSettings {
  if (model) registry?.resolve(model, "");
  if (control) return Object.keys(changes).length === 0 ? control.settings(model) : control.update(model, changes);
  for (const [key, value] of Object.entries(changes)) {
    const off = key === "trace_level" && value.every((v) => v === "OFF");
    if (!off) throw new StageError(Code.Unimplemented, "", `tracing is not enabled on this server (setting ${key})`);
  }
  return { trace_level: ["OFF"] };
}
