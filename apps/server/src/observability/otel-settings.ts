/**
 * Trace mode opentelemetry's settings (--trace-config opentelemetry,<setting>=<value>) and
 * Triton's defaults for them: read by the command line without loading the OpenTelemetry SDK
 * (otel.ts, loaded only when the mode is asked for).
 */

export interface OtelSettings {
  /** The collector's OTLP/HTTP traces endpoint. */
  url: string;
  /** Resource attributes (service.name and the like). */
  resource: Record<string, string>;
  /** The batch span processor's settings, as Triton names them. */
  bspMaxQueueSize: number;
  bspScheduleDelayMs: number;
  bspMaxExportBatchSize: number;
}

/** Triton's defaults, with our own service name. */
export const DEFAULT_OTEL_SETTINGS: Readonly<OtelSettings> = {
  url: "http://localhost:4318/v1/traces",
  resource: { "service.name": "trellis-server" },
  bspMaxQueueSize: 2048,
  bspScheduleDelayMs: 5000,
  bspMaxExportBatchSize: 512,
};
