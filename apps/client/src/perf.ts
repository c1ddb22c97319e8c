/**
 * perf_analyzer's measurement, for Trellis or Triton over gRPC or HTTP: at each
 * concurrency, that many requests in flight for a measurement window, giving the
 * client's throughput and latency percentiles, and the server's own account of
 * the window (ModelStatistics before and after: requests, executions, and where
 * the time went, for the model and every model it ran, an ensemble's steps).
 * A request counts in the window its answer arrives in, whenever it was sent, as
 * perf_analyzer counts (InferenceProfiler::ValidLatencyMeasurement): with requests
 * as long as the window, counting only those sent and answered inside it reads ~0.
 */
import type { ModelStatistics } from "@trellis/protocol";
import type { InferRequest } from "@trellis/stage";
import type { Endpoint } from "./endpoint.js";

export interface PerfOptions {
  model: string;
  /** Requests to send, in turn. */
  requests: InferRequest[];
  /** Items per request (for inferences per second). */
  batch: number;
  concurrency: number;
  /** The measurement window. */
  windowMs: number;
  /** Calls before the window, not counted (connections, caches and batching settle). */
  warmupMs: number;
  /** Called with the window's elapsed fraction (0..1) as it goes. */
  onProgress?: (fraction: number) => void;
  /** Each caller sends its requests on a ModelStreamInfer stream of its own (perf_analyzer's --streaming; gRPC only). */
  streaming?: boolean;
  /** A stateful model: each caller sends sequences (perf_analyzer's --sequence-length and --sequence-id-range). */
  sequences?: SequenceOptions;
}

export interface SequenceOptions {
  /** Requests per sequence: the first says sequence_start, the last sequence_end. */
  length: number;
  /** Correlation IDs given out in turn from `firstId`, back to it after `lastId`. */
  firstId: number;
  lastId: number;
}

/**
 * Sequence flags for one caller's requests: a new ID (the callers share the range) at each
 * sequence's start. `open` says whether the caller is inside a sequence, which it finishes
 * after the window (uncounted) so no sequence is left holding a slot on the server.
 */
function sequenceStepper(options: SequenceOptions, ids: { next: number }) {
  let id = 0;
  let position = 0;
  return {
    get open() {
      return position > 0;
    },
    next(request: InferRequest): InferRequest {
      if (position === 0) {
        id = ids.next;
        ids.next = ids.next >= options.lastId ? options.firstId : ids.next + 1;
      }
      const parameters = {
        ...request.parameters,
        sequence_id: id,
        sequence_start: position === 0,
        sequence_end: position === options.length - 1,
      };
      position = (position + 1) % options.length;
      return { ...request, parameters };
    },
  };
}

/** One model's account of the window: counts, and average microseconds per request. */
export interface ServerSide {
  model: string;
  version: string;
  requests: number;
  inferences: number;
  executions: number;
  /** Average µs per successful request: the whole request, queue, compute input, infer and output. */
  requestUs: number;
  queueUs: number;
  computeInputUs: number;
  computeInferUs: number;
  computeOutputUs: number;
}

export interface PerfResult {
  /** Requests kept in flight; in request-rate mode, the most that were in flight at once. */
  concurrency: number;
  /** Request-rate mode: requests sent per second (perf_analyzer's --request-rate-range). */
  requestRate?: number;
  /** Request-rate mode: requests sent in the window, as scheduled (windowMs × rate of them at even gaps). */
  sent?: number;
  /** Requests answered within the window. */
  requests: number;
  /** Inferences per second (requests × batch). */
  throughput: number;
  latencyUs: { avg: number; p50: number; p90: number; p95: number; p99: number };
  /** The model first, then the other models that ran requests in the window. */
  server: ServerSide[];
}

const percentile = (sorted: number[], p: number) =>
  sorted.length === 0 ? 0 : sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!;

function serverSide(before: ModelStatistics[], after: ModelStatistics[], model: string): ServerSide[] {
  const key = (s: ModelStatistics) => `${s.name}/${s.version}`;
  const earlier = new Map(before.map((s) => [key(s), s]));
  const rows: ServerSide[] = [];
  for (const s of after) {
    const b = earlier.get(key(s));
    const delta = (f: (x: ModelStatistics) => bigint | undefined) => Number((f(s) ?? 0n) - (b ? (f(b) ?? 0n) : 0n));
    const requests = delta((x) => x.inferenceStats?.success?.count);
    if (requests <= 0) continue;
    const us = (f: (x: ModelStatistics) => bigint | undefined) => delta(f) / requests / 1000;
    rows.push({
      model: s.name,
      version: s.version,
      requests,
      inferences: delta((x) => x.inferenceCount),
      executions: delta((x) => x.executionCount),
      requestUs: us((x) => x.inferenceStats?.success?.ns),
      queueUs: us((x) => x.inferenceStats?.queue?.ns),
      computeInputUs: us((x) => x.inferenceStats?.computeInput?.ns),
      computeInferUs: us((x) => x.inferenceStats?.computeInfer?.ns),
      computeOutputUs: us((x) => x.inferenceStats?.computeOutput?.ns),
    });
  }
  return rows.sort((a, b) => Number(b.model === model) - Number(a.model === model));
}

/**
 * Measures one concurrency. The first failed request ends the measurement and is
 * thrown (as perf_analyzer stops on an error): a run against the wrong model or
 * input says so at once instead of timing errors.
 */
export async function measure(endpoint: Endpoint, options: PerfOptions): Promise<PerfResult> {
  const { model, requests, concurrency, windowMs, warmupMs } = options;
  let next = 0;
  let failure: unknown;
  // Open-ended through the warm-up; the window's end once it is set.
  let stopAt = Number.POSITIVE_INFINITY;
  let windowStart = 0;
  let windowEnd = 0;
  const latencies: number[] = [];
  let measuring = false;

  if (options.streaming && !endpoint.openStream) {
    throw new RangeError("streaming needs gRPC (ModelStreamInfer), as perf_analyzer's --streaming");
  }
  const ids = { next: options.sequences?.firstId ?? 0 };
  const worker = async () => {
    const stream = options.streaming ? endpoint.openStream?.(model) : undefined;
    const sequence = options.sequences ? sequenceStepper(options.sequences, ids) : undefined;
    try {
      // After the window, a caller inside a sequence sends the rest of it, uncounted.
      while (failure === undefined && (performance.now() < stopAt || sequence?.open)) {
        const picked = requests[next++ % requests.length]!;
        const request = sequence ? sequence.next(picked) : picked;
        const start = performance.now();
        try {
          await (stream ? stream.infer(request) : endpoint.infer(model, request));
        } catch (err) {
          failure ??= err;
          return;
        }
        const end = performance.now();
        if (measuring && end >= windowStart && end <= windowEnd) latencies.push(end - start);
      }
    } finally {
      stream?.close();
    }
  };

  // Warm-up, then the window: the same workers keep going, so the load never drops in between.
  const workers = Array.from({ length: concurrency }, worker);
  await new Promise((r) => setTimeout(r, warmupMs));
  const windowBefore = await endpoint.statistics();
  windowStart = performance.now();
  windowEnd = windowStart + windowMs;
  stopAt = windowEnd;
  measuring = true;
  const progress = options.onProgress
    ? setInterval(() => options.onProgress?.(Math.min(1, (performance.now() - windowStart) / windowMs)), 100)
    : undefined;
  await Promise.all(workers);
  clearInterval(progress);
  options.onProgress?.(1);
  if (failure !== undefined) throw failure;
  const after = await endpoint.statistics();
  return summarize(latencies, options.batch, windowMs, concurrency, windowBefore, after, model);
}

/** The request schedule of perf_analyzer's request-rate mode: even gaps, or a Poisson process's. */
export type RequestDistribution = "constant" | "poisson";

export interface RatePerfOptions extends Omit<PerfOptions, "concurrency" | "streaming" | "sequences"> {
  /** Requests sent per second, whatever the answers take (an open loop). */
  rate: number;
  distribution?: RequestDistribution;
}

/**
 * Measures one request rate, as perf_analyzer's --request-rate-range: requests go out on
 * schedule (every 1/rate s, or at a Poisson process's times) without waiting for earlier
 * ones, so latency is measured under that load, queueing included. The schedule is fixed
 * in advance: the warm-up sends the requests due before it ends, the window those due
 * within it (windowMs × rate of them at even gaps), each at its time or, if this process
 * was held up, as soon as it can, so a busy machine delays requests but never drops them.
 * The first failure ends the measurement and is thrown.
 */
export async function measureRate(endpoint: Endpoint, options: RatePerfOptions): Promise<PerfResult> {
  const { model, requests, rate, windowMs, warmupMs } = options;
  const gapMs = 1000 / rate;
  const poisson = options.distribution === "poisson";
  const nextGap = () => (poisson ? -Math.log(1 - Math.random()) * gapMs : gapMs);
  let failure: unknown;
  let windowStart = Number.POSITIVE_INFINITY;
  let windowEnd = Number.POSITIVE_INFINITY;
  const latencies: number[] = [];
  const inFlight = new Set<Promise<void>>();
  let mostInFlight = 0;
  let k = 0;
  const progress = options.onProgress
    ? setInterval(() => {
        if (performance.now() >= windowStart) {
          options.onProgress?.(Math.min(1, (performance.now() - windowStart) / windowMs));
        }
      }, 100)
    : undefined;
  const at = async (due: number) => {
    const wait = due - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
  };
  const send = () => {
    const start = performance.now();
    const call = endpoint.infer(model, requests[k++ % requests.length]!).then(
      () => {
        const end = performance.now();
        if (end >= windowStart && end <= windowEnd) latencies.push(end - start);
      },
      (err: unknown) => {
        failure ??= err;
      },
    );
    const tracked = call.finally(() => inFlight.delete(tracked));
    inFlight.add(tracked);
    mostInFlight = Math.max(mostInFlight, inFlight.size);
  };

  // The warm-up: the requests due before it ends.
  const begun = performance.now();
  for (let due = begun; failure === undefined && due < begun + warmupMs; due += nextGap()) {
    await at(due);
    send();
  }
  // The window opens: the server's counts now, then the schedule starts again from here.
  const windowBefore = failure === undefined ? await endpoint.statistics() : [];
  windowStart = performance.now();
  windowEnd = windowStart + windowMs;
  let sent = 0;
  for (
    let offset = 0;
    failure === undefined && offset < windowMs;
    offset = poisson ? offset + nextGap() : (sent * 1000) / rate
  ) {
    await at(windowStart + offset);
    send();
    sent++;
  }
  await Promise.all(inFlight);
  clearInterval(progress);
  options.onProgress?.(1);
  if (failure !== undefined) throw failure;
  const after = await endpoint.statistics();
  return {
    ...summarize(latencies, options.batch, windowMs, mostInFlight, windowBefore, after, model),
    requestRate: rate,
    sent,
  };
}

/** A window's latencies and the server's account of it, as a PerfResult. */
function summarize(
  latencies: number[],
  batch: number,
  windowMs: number,
  concurrency: number,
  before: ModelStatistics[],
  after: ModelStatistics[],
  model: string,
): PerfResult {
  if (latencies.length === 0) {
    // perf_analyzer refuses such a window too ("no valid requests recorded within time interval").
    throw new RangeError(
      `no request was answered within the ${windowMs} ms measurement window: use a larger --measurement-interval (-p)`,
    );
  }
  const sorted = [...latencies].sort((a, b) => a - b);
  const us = (ms: number) => Math.round(ms * 1000);
  const avg = sorted.length ? sorted.reduce((a, b) => a + b, 0) / sorted.length : 0;
  return {
    concurrency,
    requests: sorted.length,
    throughput: (sorted.length * batch) / (windowMs / 1000),
    latencyUs: {
      avg: us(avg),
      p50: us(percentile(sorted, 50)),
      p90: us(percentile(sorted, 90)),
      p95: us(percentile(sorted, 95)),
      p99: us(percentile(sorted, 99)),
    },
    server: serverSide(before, after, model),
  };
}

/** A result as perf_analyzer prints one concurrency (or one request rate). */
export function formatResult(r: PerfResult, protocol: string): string {
  const lines = [
    r.requestRate !== undefined
      ? `Request Rate: ${r.requestRate} inference requests per seconds (${r.sent ?? 0} sent, at most ${r.concurrency} in flight)`
      : `Request concurrency: ${r.concurrency}`,
    "  Client:",
    `    Request count: ${r.requests}`,
    `    Throughput: ${r.throughput.toFixed(2)} infer/sec`,
    `    Avg latency: ${r.latencyUs.avg} usec (${protocol})`,
    `    p50 latency: ${r.latencyUs.p50} usec`,
    `    p90 latency: ${r.latencyUs.p90} usec`,
    `    p95 latency: ${r.latencyUs.p95} usec`,
    `    p99 latency: ${r.latencyUs.p99} usec`,
    "  Server:",
  ];
  for (const s of r.server) {
    const overhead = Math.max(0, s.requestUs - s.queueUs - s.computeInputUs - s.computeInferUs - s.computeOutputUs);
    lines.push(
      `    ${s.model} (version ${s.version}): ${s.requests} requests, ${s.inferences} inferences, ${s.executions} executions`,
      `      Avg request latency: ${Math.round(s.requestUs)} usec (overhead ${Math.round(overhead)} usec + queue ${Math.round(s.queueUs)} usec + compute input ${Math.round(s.computeInputUs)} usec + compute infer ${Math.round(s.computeInferUs)} usec + compute output ${Math.round(s.computeOutputUs)} usec)`,
    );
  }
  return lines.join("\n");
}

/**
 * The results as a CSV file, as perf_analyzer's -f writes one row per concurrency: its column
 * names where the figure is the same (latencies in µs; the server's from the model's own
 * statistics), and none for what this tool does not measure (the client's send and receive).
 */
export function latencyReport(results: PerfResult[]): string {
  const rateMode = results.some((r) => r.requestRate !== undefined);
  const header = [
    rateMode ? "Request Rate" : "Concurrency",
    "Inferences/Second",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
    "Avg latency",
  ];
  const rows = results.map((r) => {
    const s = r.server[0];
    const us = (v: number | undefined) => String(Math.round(v ?? 0));
    return [
      String(rateMode ? r.requestRate : r.concurrency),
      r.throughput.toFixed(2),
      us(s?.queueUs),
      us(s?.computeInputUs),
      us(s?.computeInferUs),
      us(s?.computeOutputUs),
      ...[r.latencyUs.p50, r.latencyUs.p90, r.latencyUs.p95, r.latencyUs.p99, r.latencyUs.avg].map(String),
    ].join(",");
  });
  return `${[header.join(","), ...rows].join("\n")}\n`;
}

/** perf_analyzer's --request-rate-range <start>:<end>:<step> (requests per second; end and step optional). */
export function requestRateRange(v: string): number[] {
  const parts = v.split(":");
  const [start, end = start, step = "1"] = parts;
  const [a, b, s] = [start, end, step].map(Number) as [number, number, number];
  if (parts.length > 3 || ![a, b, s].every((n) => Number.isFinite(n) && n > 0) || b < a) {
    throw new RangeError("<start>[:<end>[:<step>]], requests per second > 0, end ≥ start");
  }
  const out: number[] = [];
  // Stepped in whole multiples, so 0.1 steps do not drift past the end.
  for (let i = 0; a + i * s <= b + 1e-9; i++) out.push(Number((a + i * s).toFixed(6)));
  return out;
}

/** perf_analyzer's --concurrency-range <start>:<end>:<step> (end and step optional). */
export function concurrencyRange(v: string): number[] {
  const parts = v.split(":");
  const [start, end = start, step = "1"] = parts;
  const [a, b, s] = [start, end, step].map(Number) as [number, number, number];
  if (parts.length > 3 || ![a, b, s].every((n) => Number.isSafeInteger(n) && n >= 1) || b < a) {
    throw new RangeError("<start>[:<end>[:<step>]], whole numbers ≥ 1, end ≥ start");
  }
  const out: number[] = [];
  for (let c = a; c <= b; c += s) out.push(c);
  return out;
}

/** perf_analyzer's --sequence-id-range <start>[:<end>]: whole numbers ≥ 1, end ≥ start (end defaults to 2^32 - 1). */
export function sequenceIdRange(v: string): number[] {
  const parts = v.split(":");
  const [start, end = String(2 ** 32 - 1)] = parts;
  const [a, b] = [start, end].map(Number) as [number, number];
  if (parts.length > 2 || ![a, b].every((n) => Number.isSafeInteger(n) && n >= 1) || b < a) {
    throw new RangeError("<start>[:<end>], whole numbers ≥ 1, end ≥ start");
  }
  return [a, b];
}
