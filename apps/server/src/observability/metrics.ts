/**
 * Prometheus metrics with Triton's names and labels. The nv_inference_*
 * values are read from each stage's ModelStatistics at scrape time, so the
 * metrics and the statistics API can never disagree.
 */
import { cpus, freemem, totalmem } from "node:os";
import { type ShadowAgreement, shadowAgreementOf } from "@trellis/model-repository";
import type { ModelStatistics } from "@trellis/protocol";
import type { Model } from "@trellis/runtime";
import type { Stage } from "@trellis/stage";
import { customMetrics, observeFirstResponses, observeIsolation, observeRequests } from "@trellis/stage/backend";
import { Counter, collectDefaultMetrics, Gauge, Registry, Summary } from "prom-client";

/** A served model as the metrics read it: a Model (or anything giving the same figures). */
export type MetricsModel = Stage & Partial<Pick<Model, "interceptor">> & { readonly inflight: number };

export interface MetricsSource {
  list(): MetricsModel[];
}

type StatsRow = { labels: { model: string; version: string }; stats: ModelStatistics; pending: number };

const usOf = (ns: bigint | undefined) => Number((ns ?? 0n) / 1000n);

export interface Metrics {
  register: Registry;
  /** The Prometheus text for one scrape. */
  scrape(): Promise<string>;
  /** Stops observing requests (the summaries). */
  close(): void;
}

/** Triton's --metrics-config settings that apply here. */
export interface MetricsOptions {
  /** counter_latencies (default true): the cumulative nv_inference_*_duration_us counters. */
  counterLatencies?: boolean;
  /** summary_latencies (default false): nv_inference_*_summary_us, quantiles over a sliding window. */
  summaryLatencies?: boolean;
  /** summary_quantiles: the quantiles the summaries give (default Triton's). */
  summaryQuantiles?: number[];
  /** histogram_latencies (default false): nv_inference_first_response_histogram_ms, for decoupled models. */
  histogramLatencies?: boolean;
  /** The host's CPU utilization and memory, nv_cpu_* (default true; tritonserver's --allow-cpu-metrics). */
  cpuMetrics?: boolean;
  /** How often per-interval metrics are sampled, in ms (default 2000; tritonserver's --metrics-interval-ms). */
  intervalMs?: number;
}

/** Triton's default summary quantiles. */
export const DEFAULT_SUMMARY_QUANTILES = [0.5, 0.9, 0.95, 0.99, 0.999];
/** The summaries' sliding window, as prometheus-cpp's (Triton's) summaries: 60 s in 5 buckets. */
const SUMMARY_WINDOW = { maxAgeSeconds: 60, ageBuckets: 5 };

export function createMetrics(
  source: MetricsSource,
  logger?: { warn(obj: object, msg?: string): void },
  options: MetricsOptions = {},
): Metrics {
  const register = new Registry();
  collectDefaultMetrics({ register });

  // One statistics snapshot per scrape, shared by every metric's collect().
  let scrape: Promise<StatsRow[]> | undefined;
  const rows = () => {
    if (!scrape) {
      scrape = Promise.all(
        source.list().map(async (stage): Promise<StatsRow[]> => {
          const labels = { model: stage.name, version: stage.version };
          try {
            return [{ labels, stats: await stage.statistics(), pending: stage.pendingRequests?.() ?? stage.inflight }];
          } catch (err) {
            // A model whose statistics cannot be read now (a remote one that is down) is left out
            // of this scrape; it must not take every other model's metrics down with it.
            logger?.warn({ ...labels, err: String(err) }, "statistics unavailable for metrics");
            return [];
          }
        }),
      ).then((perStage) => perStage.flat());
    }
    return scrape;
  };

  const counter = (name: string, help: string, value: (s: ModelStatistics) => number) =>
    new Counter({
      name,
      help,
      labelNames: ["model", "version"],
      registers: [register],
      async collect() {
        this.reset();
        for (const r of await rows()) this.inc(r.labels, value(r.stats));
      },
    });

  counter("nv_inference_request_success", "Number of successful inference requests, all batch sizes", (s) =>
    Number(s.inferenceStats?.success?.count ?? 0n),
  );
  counter("nv_inference_request_failure", "Number of failed inference requests, all batch sizes", (s) =>
    Number(s.inferenceStats?.fail?.count ?? 0n),
  );
  counter("nv_inference_count", "Number of inferences performed (a batch of n counts n)", (s) =>
    Number(s.inferenceCount),
  );
  counter("nv_inference_exec_count", "Number of model executions performed (a batch counts once)", (s) =>
    Number(s.executionCount),
  );
  if (options.counterLatencies ?? true) {
    counter(
      "nv_inference_request_duration_us",
      "Cumulative inference request duration in microseconds (includes cached requests)",
      (s) => usOf(s.inferenceStats?.success?.ns),
    );
    counter("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds", (s) =>
      usOf(s.inferenceStats?.queue?.ns),
    );
    counter("nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds", (s) =>
      usOf(s.inferenceStats?.computeInput?.ns),
    );
    counter("nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds", (s) =>
      usOf(s.inferenceStats?.computeInfer?.ns),
    );
    counter(
      "nv_inference_compute_output_duration_us",
      "Cumulative inference compute output duration in microseconds",
      (s) => usOf(s.inferenceStats?.computeOutput?.ns),
    );
  }
  const stopSummaries = options.summaryLatencies
    ? latencySummaries(register, source, options.summaryQuantiles ?? DEFAULT_SUMMARY_QUANTILES)
    : () => undefined;
  const stopHistograms = options.histogramLatencies ? firstResponseHistograms(register, source) : () => undefined;
  counter("nv_cache_num_hits_per_model", "Number of response cache hits per model", (s) =>
    Number(s.inferenceStats?.cacheHit?.count ?? 0n),
  );
  counter("nv_cache_num_misses_per_model", "Number of response cache misses per model", (s) =>
    Number(s.inferenceStats?.cacheMiss?.count ?? 0n),
  );
  counter(
    "nv_cache_hit_duration_per_model",
    "Cumulative time requests spend on response cache hits, in microseconds",
    (s) => usOf(s.inferenceStats?.cacheHit?.ns),
  );
  counter(
    "nv_cache_miss_duration_per_model",
    "Cumulative time requests spend on response cache misses (lookup and insertion), in microseconds",
    (s) => usOf(s.inferenceStats?.cacheMiss?.ns),
  );
  new Gauge({
    name: "nv_inference_pending_request_count",
    help: "Instantaneous number of pending requests awaiting execution per-model.",
    labelNames: ["model", "version"],
    registers: [register],
    async collect() {
      this.reset();
      for (const r of await rows()) this.set(r.labels, r.pending);
    },
  });
  const stopHost = (options.cpuMetrics ?? true) ? hostMetrics(register, options.intervalMs ?? 2000) : () => undefined;
  const stopIsolation = isolationCounters(register, source);
  shadowAgreementMetrics(register, source);
  return {
    register,
    close() {
      stopIsolation();
      stopSummaries();
      stopHistograms();
      stopHost();
    },
    scrape: async () => {
      scrape = undefined;
      try {
        // Then the families models made themselves (a Python model's pb_utils.MetricFamily).
        return (await register.metrics()) + customMetrics.text();
      } finally {
        scrape = undefined;
      }
    },
  };
}

/**
 * Failure isolation's work per model (not Triton's: trellis_*): executions run again to find
 * the request that failed a merged batch, and requests run alone in the quarantine lane.
 */
function isolationCounters(register: Registry, source: MetricsSource): () => void {
  const labelNames = ["model", "version"];
  const reruns = new Counter({
    name: "trellis_inference_rerun_count",
    help: "Number of model executions run again to find the request that failed a merged batch",
    labelNames,
    registers: [register],
  });
  const quarantined = new Counter({
    name: "trellis_inference_quarantined_count",
    help: "Number of requests that recently failed and ran alone in the quarantine lane instead of a merged batch",
    labelNames,
    registers: [register],
  });
  return observeIsolation(({ model, version, reruns: reran, quarantined: laned }) => {
    // Another server in this process may serve the model: count only this one's.
    if (!source.list().some((stage) => stage.name === model && stage.version === version)) return;
    const labels = { model, version };
    if (reran > 0) reruns.inc(labels, reran);
    if (laned > 0) quarantined.inc(labels, laned);
  });
}

/**
 * Shadow mode's running agreement (not Triton's: trellis_*), for models whose config names a
 * `shadow_model`: sampled requests by result, and per output the elements compared, those that
 * differed and the largest |Δ| (numbers only).
 */
function shadowAgreementMetrics(register: Registry, source: MetricsSource): void {
  const labelNames = ["model", "version", "shadow"];
  const shadowed = () =>
    source.list().flatMap((stage) => {
      const agreement = shadowAgreementOf(stage);
      return agreement
        ? [{ labels: { model: stage.name, version: stage.version, shadow: agreement.shadow }, agreement }]
        : [];
    });
  new Counter({
    name: "trellis_shadow_request_count",
    help: "Requests sampled for shadow mode, by result: agreed, differed, shadow_failed, skipped",
    labelNames: [...labelNames, "result"],
    registers: [register],
    collect() {
      this.reset();
      for (const { labels, agreement: a } of shadowed()) {
        this.inc({ ...labels, result: "agreed" }, a.agreed);
        this.inc({ ...labels, result: "differed" }, a.differed);
        this.inc({ ...labels, result: "shadow_failed" }, a.shadowFailed);
        this.inc({ ...labels, result: "skipped" }, a.skipped);
      }
    },
  });
  // Per output: counts are counters, the largest |Δ| a gauge; each read afresh at every scrape.
  const perOutput = (
    name: string,
    help: string,
    value: (o: ShadowAgreement["outputs"][number]) => number | undefined,
    kind: typeof Counter | typeof Gauge = Counter,
  ) =>
    new kind({
      name,
      help,
      labelNames: [...labelNames, "output"],
      registers: [register],
      collect() {
        this.reset();
        for (const { labels, agreement } of shadowed()) {
          for (const o of agreement.outputs) {
            const v = value(o);
            const output = o.output.slice(labels.model.length + 1);
            if (v === undefined) continue;
            if (this instanceof Gauge) this.set({ ...labels, output }, v);
            else (this as Counter).inc({ ...labels, output }, v);
          }
        }
      },
    });
  perOutput(
    "trellis_shadow_output_element_count",
    "Output elements compared with the shadow model's",
    (o) => o.elements,
  );
  perOutput(
    "trellis_shadow_output_mismatch_count",
    "Output elements that differed from the shadow model's (strings: any byte)",
    (o) => o.mismatching,
  );
  perOutput(
    "trellis_shadow_output_max_abs_delta",
    "Largest |difference| from the shadow model's output (numeric outputs)",
    (o) => o.maxAbsDelta,
    Gauge,
  );
}

/**
 * Triton's latency summaries, fed by every request a model records (observeRequests):
 * request, queue and compute input / infer / output times in µs, per model and version.
 * A model no longer served is dropped from them at the next scrape. Returns the stop.
 */
function latencySummaries(register: Registry, source: MetricsSource, percentiles: number[]): () => void {
  const seen = new Map<string, { model: string; version: string }>();
  const summaries: Summary[] = [];
  const summary = (name: string, help: string) => {
    const s = new Summary({
      name,
      help,
      labelNames: ["model", "version"],
      percentiles,
      ...SUMMARY_WINDOW,
      registers: [register],
      collect() {
        if (s !== summaries[0]) return;
        const live = new Set(source.list().map((stage) => `${stage.name}/${stage.version}`));
        for (const [key, labels] of seen) {
          if (live.has(key)) continue;
          for (const each of summaries) each.remove(labels);
          seen.delete(key);
        }
      },
    });
    summaries.push(s);
    return s;
  };
  const request = summary("nv_inference_request_summary_us", "Summary of inference request duration in microseconds");
  const queue = summary("nv_inference_queue_summary_us", "Summary of inference queuing duration in microseconds");
  const input = summary("nv_inference_compute_input_summary_us", "Summary of compute input duration in microseconds");
  const infer = summary(
    "nv_inference_compute_infer_summary_us",
    "Summary of compute inference duration in microseconds",
  );
  const output = summary(
    "nv_inference_compute_output_summary_us",
    "Summary of inference compute output duration in microseconds",
  );
  return observeRequests(({ model, version, totalNs, queueNs, times }) => {
    const labels = { model, version };
    seen.set(`${model}/${version}`, labels);
    request.observe(labels, totalNs / 1000);
    queue.observe(labels, queueNs / 1000);
    input.observe(labels, times.computeInputNs / 1000);
    infer.observe(labels, times.computeInferNs / 1000);
    output.observe(labels, times.computeOutputNs / 1000);
  });
}

/** Triton's default buckets for nv_inference_first_response_histogram_ms, in ms. */
export const DEFAULT_FIRST_RESPONSE_BUCKETS = [100, 500, 2000, 5000];
const FIRST_RESPONSE = "nv_inference_first_response_histogram_ms";

/** The buckets a model's config gives the histogram (model_metrics' metric_control), else Triton's defaults. */
function firstResponseBuckets(stage: MetricsModel | undefined): number[] {
  for (const control of stage?.config.modelMetrics?.metricControl ?? []) {
    const options = control.metricOptions;
    if (control.metricIdentifier?.family === FIRST_RESPONSE && options.case === "histogramOptions") {
      return [...options.value.buckets].sort((a, b) => a - b);
    }
  }
  return DEFAULT_FIRST_RESPONSE_BUCKETS;
}

interface FirstResponseSeries {
  labels: { model: string; version: string };
  buckets: number[];
  /** Observations at or under each bucket's bound (cumulative, as Prometheus reads them). */
  counts: number[];
  count: number;
  sum: number;
}

/**
 * Triton's nv_inference_first_response_histogram_ms (--metrics-config histogram_latencies=true):
 * per decoupled model, the time from a request to its first response, in ms, in buckets the
 * model's config may set (model_metrics { metric_control { metric_identifier { family } histogram_options { buckets } } }),
 * else Triton's defaults. prom-client keeps one bucket list per metric, so this one renders its
 * series itself. A model no longer served is dropped at the next scrape. Returns the stop.
 */
function firstResponseHistograms(register: Registry, source: MetricsSource): () => void {
  const series = new Map<string, FirstResponseSeries>();
  register.registerMetric({
    name: FIRST_RESPONSE,
    help: "Duration from request to first response in milliseconds",
    type: "histogram",
    aggregator: "sum",
    get: async () => {
      const live = new Set(source.list().map((stage) => `${stage.name}/${stage.version}`));
      for (const key of series.keys()) if (!live.has(key)) series.delete(key);
      const values = [...series.values()].flatMap((s) => [
        ...s.buckets.map((le, i) => ({
          metricName: `${FIRST_RESPONSE}_bucket`,
          labels: { ...s.labels, le },
          value: s.counts[i] as number,
        })),
        { metricName: `${FIRST_RESPONSE}_bucket`, labels: { ...s.labels, le: "+Inf" }, value: s.count },
        { metricName: `${FIRST_RESPONSE}_sum`, labels: s.labels, value: s.sum },
        { metricName: `${FIRST_RESPONSE}_count`, labels: s.labels, value: s.count },
      ]);
      return {
        name: FIRST_RESPONSE,
        help: "Duration from request to first response in milliseconds",
        type: "histogram",
        aggregator: "sum",
        values,
      };
    },
  } as unknown as Parameters<Registry["registerMetric"]>[0]);
  return observeFirstResponses(({ model, version, ns }) => {
    const key = `${model}/${version}`;
    let s = series.get(key);
    if (!s) {
      const stage = source.list().find((st) => st.name === model && st.version === version);
      const buckets = firstResponseBuckets(stage);
      s = { labels: { model, version }, buckets, counts: buckets.map(() => 0), count: 0, sum: 0 };
      series.set(key, s);
    }
    const ms = ns / 1e6;
    s.buckets.forEach((le, i) => {
      if (ms <= le) (s.counts[i] as number)++;
    });
    s.count++;
    s.sum += ms;
  });
}

/** CPU time summed over every core: busy and total, in ms. */
function cpuTimes(): { busy: number; total: number } {
  let busy = 0;
  let total = 0;
  for (const { times } of cpus()) {
    const b = times.user + times.nice + times.sys + times.irq;
    busy += b;
    total += b + times.idle;
  }
  return { busy, total };
}

/**
 * Triton's host metrics, so dashboards built for Triton read them: the machine's CPU
 * utilization (0..1) and memory. Utilization is a per-interval metric, as Triton's:
 * sampled every `intervalMs`, a scrape reads the last whole interval (so scrapers
 * at any rate, or several, read the same thing). Returns the stop.
 */
function hostMetrics(register: Registry, intervalMs: number): () => void {
  let previous = cpuTimes();
  const utilization = new Gauge({
    name: "nv_cpu_utilization",
    help: "CPU utilization rate [0.0 - 1.0]",
    registers: [register],
  });
  const sample = setInterval(() => {
    const now = cpuTimes();
    const total = now.total - previous.total;
    if (total > 0) utilization.set((now.busy - previous.busy) / total);
    previous = now;
  }, intervalMs);
  sample.unref();
  new Gauge({
    name: "nv_cpu_memory_total_bytes",
    help: "CPU total memory (RAM), in bytes",
    registers: [register],
    collect() {
      this.set(totalmem());
    },
  });
  new Gauge({
    name: "nv_cpu_memory_used_bytes",
    help: "CPU used memory (RAM), in bytes",
    registers: [register],
    collect() {
      this.set(totalmem() - freemem());
    },
  });
  return () => clearInterval(sample);
}
