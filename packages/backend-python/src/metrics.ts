/**
 * A Python model's custom metrics (pb_utils.MetricFamily / Metric) in the server's one store,
 * which bounds them (families, label sets) and which /metrics shows beside nv_inference_*.
 */
import { type CustomMetricKind, customMetrics } from "@trellis/stage/backend";
import { tritonCodeOf } from "./codes.js";
import { encodeFrame, type Frame } from "./frames.js";

const KINDS: readonly CustomMetricKind[] = ["counter", "gauge", "histogram"];

/** A family or metric made, or a value read: the answer frame (an error the model raises). */
export function answerMetric(header: Frame["header"]): Buffer {
  try {
    const name = String(header.name);
    if (header.op === "family") {
      const kind = KINDS.find((k) => k === header.kind);
      if (!kind) throw new Error(`MetricFamily "${name}": no kind "${String(header.kind)}"`);
      customMetrics.family(name, String(header.description ?? ""), kind);
      return encodeFrame({ type: "bls_result", id: header.id });
    }
    if (header.op === "metric") {
      const labels = (header.labels ?? {}) as Record<string, string>;
      const buckets = Array.isArray(header.buckets) ? (header.buckets as number[]) : undefined;
      return encodeFrame({ type: "bls_result", id: header.id, key: customMetrics.metric(name, labels, buckets) });
    }
    return encodeFrame({ type: "bls_result", id: header.id, value: customMetrics.value(name, String(header.key)) });
  } catch (e) {
    const code = (e as { code?: number }).code;
    const message = (e as { rawMessage?: string }).rawMessage ?? (e as Error).message;
    return encodeFrame({
      type: "bls_result",
      id: header.id,
      error: message,
      code: typeof code === "number" ? tritonCodeOf(code) : 1,
    });
  }
}

/** increment / set / observe, checked by pb_utils first; anything still wrong is only logged. */
export function applyMetricUpdate(header: Frame["header"], log?: (line: string) => void): void {
  const op = header.op;
  if (op !== "increment" && op !== "set" && op !== "observe") return;
  try {
    customMetrics.update(String(header.name), String(header.key), op, Number(header.value));
  } catch (e) {
    log?.(`custom metric update refused: ${(e as Error).message}\n`);
  }
}
