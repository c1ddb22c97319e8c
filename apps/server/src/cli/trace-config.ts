/**
 * Tracing as the command line asks for it, read as tritonserver reads it:
 * --trace-config "[<mode>,]<setting>=<value>" (repeatable) and the deprecated
 * --trace-file / --trace-level / --trace-rate / --trace-count /
 * --trace-log-frequency, with trace mode opentelemetry's settings.
 */
import { constants } from "node:fs";
import { access } from "node:fs/promises";
import { dirname, resolve } from "node:path";
import { DEFAULT_OTEL_SETTINGS, type OtelSettings } from "../observability/otel-settings.js";
import { DEFAULT_RECENT_TRACE_BOUNDS } from "../observability/recent-traces.js";
import { DEFAULT_TRACE_VALUES, parseTraceSetting, type TraceValues } from "../observability/tracing.js";
import { splitSetting, UsageError } from "./usage.js";

/** The command line's tracing flags (commander's names). */
export interface TraceFlags {
  traceConfig: string[];
  traceFile?: string;
  traceLevel: string[];
  traceRate?: string;
  traceCount?: string;
  traceLogFrequency?: string;
}

/** --trace-config's names for the trace extension's settings: global ones, then trace mode triton's. */
const TRACE_CONFIG_GLOBAL: Record<string, string> = {
  level: "trace_level",
  rate: "trace_rate",
  count: "trace_count",
  mode: "trace_mode",
};
const TRACE_CONFIG_TRITON: Record<string, string> = { file: "trace_file", "log-frequency": "log_frequency" };

/**
 * Tracing as the command line sets it: tritonserver's deprecated --trace-* flags,
 * then --trace-config entries ("<setting>=<value>" or "triton,<setting>=<value>"),
 * later ones winning (levels add up, as repeated --trace-config level= do).
 */
export async function readTraceConfig(flags: TraceFlags): Promise<{ tracing: TraceValues; otel?: OtelSettings }> {
  const given = new Map<string, string[]>();
  const put = (setting: string, value: string) =>
    given.set(setting, setting === "trace_level" ? [...(given.get(setting) ?? []), value] : [value]);
  if (flags.traceFile !== undefined) put("trace_file", flags.traceFile);
  for (const level of flags.traceLevel) put("trace_level", level);
  if (flags.traceRate !== undefined) put("trace_rate", flags.traceRate);
  if (flags.traceCount !== undefined) put("trace_count", flags.traceCount);
  if (flags.traceLogFrequency !== undefined) put("log_frequency", flags.traceLogFrequency);
  const otelGiven: [string, string][] = [];
  let recent: TraceValues["recent"];
  for (const entry of flags.traceConfig) {
    const { scope: mode, key, value } = splitSetting(entry);
    if (mode === "opentelemetry" && value !== undefined) {
      otelGiven.push([key, value]);
      continue;
    }
    if (mode === "recent") {
      recent = recentBound(recent, key, value);
      continue;
    }
    const names = mode === undefined ? TRACE_CONFIG_GLOBAL : mode === "triton" ? TRACE_CONFIG_TRITON : undefined;
    const setting = names?.[key];
    if (!setting || value === undefined) {
      throw new UsageError(
        `--trace-config ${entry}: expected level=, rate=, count=, mode=, triton,file=, triton,log-frequency=, recent,count=, recent,bytes= or opentelemetry,<setting>=<value>`,
      );
    }
    put(setting, value);
  }
  const values: TraceValues = { ...DEFAULT_TRACE_VALUES, ...(recent ? { recent } : {}) };
  for (const [setting, list] of given) {
    try {
      Object.assign(values, parseTraceSetting(setting, list));
    } catch (err) {
      throw new UsageError(`--trace-config ${(err as Error).message}`);
    }
  }
  if (values.mode === "opentelemetry") {
    if (values.level.includes("TENSORS")) {
      throw new UsageError("--trace-config level=TENSORS writes tensors to trace files: it needs mode triton");
    }
    return { tracing: values, otel: otelSettings(otelGiven) };
  }
  if (otelGiven.length > 0) {
    throw new UsageError("--trace-config opentelemetry,<setting>=... needs --trace-config mode=opentelemetry");
  }
  if (values.level.length > 0 && !values.file) {
    throw new UsageError("--trace-config level=TIMESTAMPS needs a trace file: --trace-config triton,file=<path>");
  }
  if (values.file) {
    // Traces are written at exit (or every log-frequency traces): a folder that cannot take them must show now.
    const folder = dirname(resolve(values.file));
    await access(folder, constants.W_OK).catch((err: Error) => {
      throw new UsageError(`--trace-config triton,file=${values.file}: cannot write in ${folder}: ${err.message}`);
    });
    values.file = resolve(values.file);
  }
  return { tracing: values };
}

/** One bound of the recent traces kept in memory: recent,count=<n> (traces) or recent,bytes=<n> (their JSON). */
function recentBound(bounds: TraceValues["recent"], key: string, value: string | undefined): TraceValues["recent"] {
  const n = Number(value);
  if ((key !== "count" && key !== "bytes") || value === undefined || !/^\d+$/.test(value) || !Number.isSafeInteger(n)) {
    throw new UsageError(
      `--trace-config recent,${key}=${value ?? ""}: expected recent,count=<traces> or recent,bytes=<bytes>, a whole number ≥ 0`,
    );
  }
  const next = { ...DEFAULT_RECENT_TRACE_BOUNDS, ...bounds };
  if (key === "count") next.maxCount = n;
  else next.maxBytes = n;
  return next;
}

/** Trace mode opentelemetry's settings (--trace-config opentelemetry,<setting>=<value>), as tritonserver's. */
function otelSettings(given: [string, string][]): OtelSettings {
  const settings: OtelSettings = { ...DEFAULT_OTEL_SETTINGS, resource: { ...DEFAULT_OTEL_SETTINGS.resource } };
  const count = (key: string, value: string) => {
    const n = Number(value);
    if (!Number.isSafeInteger(n) || n < 1) {
      throw new UsageError(`--trace-config opentelemetry,${key}=${value}: expected a whole number ≥ 1`);
    }
    return n;
  };
  for (const [key, value] of given) {
    if (key === "url") {
      if (!/^https?:\/\/[^/]/.test(value)) {
        throw new UsageError(`--trace-config opentelemetry,url=${value}: expected an http:// or https:// URL`);
      }
      settings.url = value;
    } else if (key === "resource") {
      const { scope, key: name, value: attribute } = splitSetting(value);
      if (scope !== undefined || !name || attribute === undefined) {
        throw new UsageError(`--trace-config opentelemetry,resource=${value}: expected resource=<key>=<value>`);
      }
      settings.resource[name] = attribute;
    } else if (key === "bsp_max_queue_size") settings.bspMaxQueueSize = count(key, value);
    else if (key === "bsp_schedule_delay") settings.bspScheduleDelayMs = count(key, value);
    else if (key === "bsp_max_export_batch_size") settings.bspMaxExportBatchSize = count(key, value);
    else {
      throw new UsageError(
        `--trace-config opentelemetry,${key}=${value}: expected url, resource, bsp_max_queue_size, bsp_schedule_delay or bsp_max_export_batch_size`,
      );
    }
  }
  if (settings.bspMaxExportBatchSize > settings.bspMaxQueueSize) {
    throw new UsageError(
      "--trace-config opentelemetry,bsp_max_export_batch_size must not exceed opentelemetry,bsp_max_queue_size",
    );
  }
  return settings;
}
