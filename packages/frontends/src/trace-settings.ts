/** Triton's trace extension settings: what TraceSetting reads and updates, over either frontend. */
import { Code, type RequestTrace, StageError } from "@trellis/stage";

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
