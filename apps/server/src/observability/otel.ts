/**
 * Triton's trace mode "opentelemetry": each finished request trace exported
 * over OTLP/HTTP as Triton shapes it — a top-level span (received to sent),
 * a span per model (its request, with its queue start as an event; an
 * ensemble's steps under the ensemble's), and a "compute" span under each —
 * the trace's timestamps as span events, and model_name, model_version,
 * request_id and parent_id as attributes. A request carrying a W3C
 * traceparent continues the caller's trace.
 *
 * Loaded (with the OpenTelemetry SDK) only when the command line asks for trace mode
 * opentelemetry: main.ts imports it then; everything else imports otel-settings.ts or types.
 */
import {
  type Attributes,
  type Context,
  DiagLogLevel,
  diag,
  type HrTime,
  ROOT_CONTEXT,
  trace,
} from "@opentelemetry/api";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { OTLPTraceExporter } from "@opentelemetry/exporter-trace-otlp-http";
import { resourceFromAttributes } from "@opentelemetry/resources";
import { BasicTracerProvider, BatchSpanProcessor } from "@opentelemetry/sdk-trace-base";
import type { OtelSettings } from "./otel-settings.js";

/** One trace as the tracer keeps it: timestamps by name (ns, monotonic), children for ensemble steps. */
export interface FinishedTrace {
  id: number;
  model: string;
  version: string;
  requestId?: string;
  parentId?: number;
  timestamps: ReadonlyMap<string, number>;
  children: readonly FinishedTrace[];
}

const FRONTEND_START = ["HTTP_RECV_START", "GRPC_WAITREAD_START"];
const FRONTEND_END = ["HTTP_SEND_END", "GRPC_SEND_END"];
const FRONTEND = ["HTTP_RECV_START", "HTTP_RECV_END", "GRPC_WAITREAD_START", "GRPC_WAITREAD_END"];
const FRONTEND_SEND = ["HTTP_SEND_START", "HTTP_SEND_END", "GRPC_SEND_START", "GRPC_SEND_END"];
const MODEL = ["REQUEST_START", "QUEUE_START", "REQUEST_END"];
const COMPUTE = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END"];

const propagator = new W3CTraceContextPropagator();

/** The SDK reports an export error as its JSON: said as "<name>: <message> (<code>) <response>". */
function readable(message: string): string {
  try {
    const e = JSON.parse(message) as { name?: string; message?: string; code?: string; data?: string };
    if (e && typeof e === "object" && typeof e.message === "string") {
      return `${e.name ?? "error"}: ${e.message}${e.code ? ` (${e.code})` : ""}${e.data ? ` ${e.data}` : ""}`;
    }
  } catch {
    // Not JSON: as it is.
  }
  return message;
}

export class OtelExport {
  private readonly provider: BasicTracerProvider;
  private readonly tracer;
  /** Wall-clock ns at monotonic 0: trace timestamps are monotonic, spans want the wall clock. */
  private readonly epochOffsetNs: bigint;

  /** @param log where the OpenTelemetry SDK's own warnings go (a collector that refuses spans, say). */
  constructor(settings: OtelSettings, log?: { warn(obj: object, msg?: string): void }) {
    if (log) {
      const warn = (message: string, ...args: unknown[]) =>
        log.warn(
          { detail: args.map((a) => (a instanceof Error ? a.message : String(a))) },
          `opentelemetry: ${readable(message)}`,
        );
      const quiet = () => undefined;
      diag.setLogger({ error: warn, warn, info: quiet, debug: quiet, verbose: quiet }, DiagLogLevel.WARN);
    }
    this.provider = new BasicTracerProvider({
      resource: resourceFromAttributes(settings.resource),
      spanProcessors: [
        new BatchSpanProcessor(new OTLPTraceExporter({ url: settings.url }), {
          maxQueueSize: settings.bspMaxQueueSize,
          scheduledDelayMillis: settings.bspScheduleDelayMs,
          maxExportBatchSize: settings.bspMaxExportBatchSize,
        }),
      ],
    });
    this.tracer = this.provider.getTracer("trellis-server");
    this.epochOffsetNs = BigInt(Date.now()) * 1_000_000n - process.hrtime.bigint();
  }

  /** The caller's trace context from a request's W3C traceparent header, when it carries one. */
  contextFrom(header: (name: string) => string | undefined): Context | undefined {
    if (!header("traceparent")) return undefined;
    const context = propagator.extract(ROOT_CONTEXT, header, {
      get: (carrier, key) => carrier(key),
      keys: () => ["traceparent", "tracestate"],
    });
    return trace.getSpanContext(context) ? context : undefined;
  }

  private time(ns: number): HrTime {
    const wall = this.epochOffsetNs + BigInt(Math.round(ns));
    return [Number(wall / 1_000_000_000n), Number(wall % 1_000_000_000n)];
  }

  /** Exports `t` (and its steps) under `parent` (a propagated context, or a new trace). */
  export(t: FinishedTrace, parent: Context = ROOT_CONTEXT): void {
    const at = (names: string[]) => names.map((n) => t.timestamps.get(n)).find((v) => v !== undefined);
    const all = [...t.timestamps.values()];
    if (all.length === 0) return;
    const start = at(FRONTEND_START) ?? Math.min(...all);
    const end = at(FRONTEND_END) ?? Math.max(...all);
    const top = this.span("InferRequest", parent, start, end, t, [...FRONTEND, ...FRONTEND_SEND], {});
    this.modelSpan(t, top);
  }

  private modelSpan(t: FinishedTrace, parent: Context): void {
    const all = [...t.timestamps.values()];
    if (all.length === 0) return;
    const start = t.timestamps.get("REQUEST_START") ?? Math.min(...all);
    const end = t.timestamps.get("REQUEST_END") ?? Math.max(...all);
    const attributes: Attributes = {
      model_name: t.model,
      model_version: Number(t.version) || -1,
      ...(t.requestId ? { request_id: t.requestId } : {}),
      ...(t.parentId !== undefined ? { parent_id: t.parentId } : {}),
    };
    const model = this.span(t.model, parent, start, end, t, MODEL, attributes);
    const computeStart = t.timestamps.get("COMPUTE_START");
    const computeEnd = t.timestamps.get("COMPUTE_END");
    if (computeStart !== undefined && computeEnd !== undefined) {
      this.span("compute", model, computeStart, computeEnd, t, COMPUTE, attributes);
    }
    for (const child of t.children) this.modelSpan(child, model);
  }

  /** A span from `start` to `end` with `t`'s timestamps among `events` as events; returns its context. */
  private span(
    name: string,
    parent: Context,
    start: number,
    end: number,
    t: FinishedTrace,
    events: string[],
    attributes: Attributes,
  ): Context {
    const span = this.tracer.startSpan(name, { startTime: this.time(start), attributes }, parent);
    for (const event of events) {
      const ns = t.timestamps.get(event);
      if (ns !== undefined) span.addEvent(event, this.time(ns));
    }
    span.end(this.time(end));
    return trace.setSpan(parent, span);
  }

  /** Exports what is queued and stops (at shutdown). */
  shutdown(): Promise<void> {
    return this.provider.shutdown();
  }
}
