/**
 * Metrics a model defines itself (Triton's custom metrics: a Python model's
 * `pb_utils.MetricFamily` / `Metric`), shown on the server's /metrics beside nv_inference_*.
 * One store per process, as Triton's: a family of the same name, description and kind made
 * again (another instance, a reload) is the same family, and the same labels the same metric.
 * Bounded: a model that makes a family or a label set per request is refused, named, past the
 * limits, and the metrics page stays small.
 */
import { Code, StageError } from "./errors.js";

export type CustomMetricKind = "counter" | "gauge" | "histogram";

export interface CustomMetricsLimits {
  /** Families in the whole server (default 128). */
  families: number;
  /** Metrics (label sets) in one family (default 1024). */
  metricsPerFamily: number;
  /** Labels on one metric (default 16). */
  labels: number;
  /** Characters of one label value (default 256). */
  labelValueLength: number;
  /** Buckets of one histogram (default 64). */
  buckets: number;
}

export const DEFAULT_CUSTOM_METRICS_LIMITS: CustomMetricsLimits = {
  families: 128,
  metricsPerFamily: 1024,
  labels: 16,
  labelValueLength: 256,
  buckets: 64,
};

interface Series {
  labels: Record<string, string>;
  value: number;
  buckets?: number[];
  counts?: number[];
  sum?: number;
  count?: number;
}

interface Family {
  name: string;
  description: string;
  kind: CustomMetricKind;
  series: Map<string, Series>;
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
// The server's own families: a model may not write lines under them.
const RESERVED = ["nv_", "trellis_", "process_", "nodejs_"];

const refuse = (message: string) => new StageError(Code.ResourceExhausted, "", message);
const invalid = (message: string) => new StageError(Code.InvalidArgument, "", message);

/** The key of a label set: its pairs in name order. */
export function labelsKey(labels: Record<string, string>): string {
  return JSON.stringify(
    Object.keys(labels)
      .sort()
      .map((k) => [k, labels[k]]),
  );
}

const escapeLabel = (v: string) => v.replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n");
const labelText = (labels: Record<string, string>, extra?: [string, string]) => {
  const pairs = Object.entries(labels).map(([k, v]) => `${k}="${escapeLabel(v)}"`);
  if (extra) pairs.push(`${extra[0]}="${extra[1]}"`);
  return pairs.length ? `{${pairs.join(",")}}` : "";
};

export class CustomMetrics {
  private readonly families = new Map<string, Family>();
  readonly limits: CustomMetricsLimits;

  constructor(limits: Partial<CustomMetricsLimits> = {}) {
    this.limits = { ...DEFAULT_CUSTOM_METRICS_LIMITS, ...limits };
  }

  /** Makes the family, or gives the one of that name when it is the same; refuses past the bound. */
  family(name: string, description: string, kind: CustomMetricKind): void {
    if (!NAME.test(name)) throw invalid(`MetricFamily name "${name}" is not a Prometheus metric name`);
    if (RESERVED.some((p) => name.startsWith(p)))
      throw invalid(`MetricFamily name "${name}": names starting ${RESERVED.join(", ")} are the server's own`);
    const known = this.families.get(name);
    if (known) {
      if (known.kind !== kind || known.description !== description)
        throw invalid(`MetricFamily "${name}" already exists as a ${known.kind} with another description or kind`);
      return;
    }
    if (this.families.size >= this.limits.families)
      throw refuse(
        `MetricFamily "${name}": the server holds at most ${this.limits.families} custom metric families (custom metric family limit)`,
      );
    this.families.set(name, { name, description, kind, series: new Map() });
  }

  /** Makes the family's metric of these labels (or finds it); its key for the updates. */
  metric(name: string, labels: Record<string, string>, buckets?: number[]): string {
    const family = this.familyOf(name);
    const entries = Object.entries(labels);
    if (entries.length > this.limits.labels)
      throw invalid(`Metric of "${name}": at most ${this.limits.labels} labels, not ${entries.length}`);
    for (const [k, v] of entries) {
      if (!LABEL.test(k)) throw invalid(`Metric of "${name}": label name "${k}" is not a Prometheus label name`);
      if (typeof v !== "string") throw invalid(`Metric of "${name}": label "${k}" must be a str`);
      if (v.length > this.limits.labelValueLength)
        throw invalid(`Metric of "${name}": label "${k}" is over ${this.limits.labelValueLength} characters`);
    }
    const key = labelsKey(labels);
    if (family.series.has(key)) return key;
    if (family.series.size >= this.limits.metricsPerFamily)
      throw refuse(
        `Metric of "${name}": a family holds at most ${this.limits.metricsPerFamily} label sets (custom metric label-set limit)`,
      );
    const series: Series = { labels: { ...labels }, value: 0 };
    if (family.kind === "histogram") {
      const edges = buckets ?? [];
      if (edges.length === 0) throw invalid(`Metric of histogram "${name}" needs buckets`);
      if (edges.length > this.limits.buckets)
        throw invalid(`Metric of "${name}": at most ${this.limits.buckets} buckets, not ${edges.length}`);
      if (edges.some((b, i) => !Number.isFinite(b) || (i > 0 && b <= (edges[i - 1] as number))))
        throw invalid(`Metric of "${name}": buckets must be finite and increasing`);
      Object.assign(series, { buckets: [...edges], counts: edges.map(() => 0), sum: 0, count: 0 });
    }
    family.series.set(key, series);
    return key;
  }

  /** increment (counter: ≥ 0; gauge), set (gauge), observe (histogram). */
  update(name: string, key: string, op: "increment" | "set" | "observe", value: number): void {
    const series = this.seriesOf(name, key);
    const kind = this.familyOf(name).kind;
    if (!Number.isFinite(value)) throw invalid(`Metric of "${name}": ${op} needs a finite number`);
    if (op === "increment" && kind !== "histogram" && !(kind === "counter" && value < 0)) series.value += value;
    else if (op === "set" && kind === "gauge") series.value = value;
    else if (op === "observe" && kind === "histogram" && series.buckets && series.counts) {
      series.buckets.forEach((le, i) => {
        if (value <= le) (series.counts as number[])[i] = ((series.counts as number[])[i] as number) + 1;
      });
      series.sum = (series.sum ?? 0) + value;
      series.count = (series.count ?? 0) + 1;
    } else throw invalid(`Metric of ${kind} "${name}": ${op}(${value}) is not allowed`);
  }

  value(name: string, key: string): number {
    return this.seriesOf(name, key).value;
  }

  /** Families' count, and metrics in each: what the bounds count. */
  size(): { families: number; metrics: number } {
    let metrics = 0;
    for (const f of this.families.values()) metrics += f.series.size;
    return { families: this.families.size, metrics };
  }

  /** The Prometheus text of every family (empty when there is none). */
  text(): string {
    const lines: string[] = [];
    for (const f of this.families.values()) {
      lines.push(`# HELP ${f.name} ${f.description.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")}`);
      lines.push(`# TYPE ${f.name} ${f.kind}`);
      for (const s of f.series.values()) {
        if (f.kind !== "histogram") {
          lines.push(`${f.name}${labelText(s.labels)} ${s.value}`);
          continue;
        }
        s.buckets?.forEach((le, i) => {
          lines.push(`${f.name}_bucket${labelText(s.labels, ["le", String(le)])} ${s.counts?.[i] ?? 0}`);
        });
        lines.push(`${f.name}_bucket${labelText(s.labels, ["le", "+Inf"])} ${s.count ?? 0}`);
        lines.push(`${f.name}_sum${labelText(s.labels)} ${s.sum ?? 0}`);
        lines.push(`${f.name}_count${labelText(s.labels)} ${s.count ?? 0}`);
      }
    }
    return lines.length ? `${lines.join("\n")}\n` : "";
  }

  private familyOf(name: string): Family {
    const family = this.families.get(name);
    if (!family) throw invalid(`no MetricFamily "${name}"`);
    return family;
  }

  private seriesOf(name: string, key: string): Series {
    const series = this.familyOf(name).series.get(key);
    if (!series) throw invalid(`no Metric of "${name}" with labels ${key}`);
    return series;
  }
}

/** The server's one store: backends write it, the metrics endpoint reads it. */
export const customMetrics = new CustomMetrics();
