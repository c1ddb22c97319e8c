/**
 * Cumulative per-model statistics in Triton's shape (ModelStatistics), kept
 * by every stage so ModelStatistics RPCs and nv_inference_* metrics agree.
 */
import { create } from "@bufbuild/protobuf";
import {
  InferBatchStatisticsSchema,
  InferStatisticsSchema,
  type ModelStatistics,
  ModelStatisticsSchema,
  StatisticDurationSchema,
} from "@trellis/protocol";

/** Durations of one model execution, in nanoseconds. */
export interface ExecutionTimes {
  computeInputNs: number;
  computeInferNs: number;
  computeOutputNs: number;
}

interface Duration {
  count: number;
  ns: number;
}

const zero = (): Duration => ({ count: 0, ns: 0 });
const add = (d: Duration, ns: number, count = 1) => {
  d.count += count;
  d.ns += Math.max(0, Math.round(ns));
};

/** Monotonic clock in nanoseconds as a number (safe for ~104 days of uptime). */
export const nowNs = (): number => Number(process.hrtime.bigint());

/** One successful request of a model, as its StatisticsRecorder takes it (nanoseconds). */
export interface RequestSample {
  model: string;
  version: string;
  totalNs: number;
  queueNs: number;
  times: ExecutionTimes;
}

export type RequestObserver = (sample: RequestSample) => void;

const observers = new Set<RequestObserver>();

/**
 * Hears every successful request a model's StatisticsRecorder records in this
 * process (for latency summaries: a distribution, where ModelStatistics keeps
 * sums). Returns the function that stops it.
 */
export function observeRequests(observer: RequestObserver): () => void {
  observers.add(observer);
  return () => observers.delete(observer);
}

/** A decoupled model's first response to one request: how long after the request it went (nanoseconds). */
export interface FirstResponseSample {
  model: string;
  version: string;
  ns: number;
}

const firstResponseObservers = new Set<(sample: FirstResponseSample) => void>();

/**
 * Hears every decoupled model's first response to each request in this process
 * (Triton's nv_inference_first_response_histogram_ms). Returns the function that stops it.
 */
export function observeFirstResponses(observer: (sample: FirstResponseSample) => void): () => void {
  firstResponseObservers.add(observer);
  return () => firstResponseObservers.delete(observer);
}

/**
 * Work a model's failure isolation did (nonzero counts only): `reruns`, executions run again
 * to find the request that failed a merged batch; `quarantined`, requests that recently failed
 * and ran alone in the quarantine lane instead of joining a batch.
 */
export interface IsolationSample {
  model: string;
  version: string;
  reruns: number;
  quarantined: number;
}

const isolationObservers = new Set<(sample: IsolationSample) => void>();

/** Hears every model's isolation work in this process (trellis_inference_* metrics). Returns the function that stops it. */
export function observeIsolation(observer: (sample: IsolationSample) => void): () => void {
  isolationObservers.add(observer);
  return () => isolationObservers.delete(observer);
}

export class StatisticsRecorder {
  private lastInference = 0;
  private inferenceCount = 0;
  private executionCount = 0;
  private readonly success = zero();
  private readonly fail = zero();
  private readonly queue = zero();
  private readonly computeInput = zero();
  private readonly computeInfer = zero();
  private readonly computeOutput = zero();
  private readonly batches = new Map<number, { input: Duration; infer: Duration; output: Duration }>();
  private readonly isolationCounts = { reruns: 0, quarantined: 0 };
  private readonly cacheHits = zero();
  private readonly cacheMisses = zero();

  /**
   * @param observed whether observeRequests hears this recorder's requests: false for a
   * copy kept elsewhere (an ensemble's per-step statistics), so no request is heard twice.
   */
  constructor(
    readonly name: string,
    readonly version: string,
    private readonly observed = true,
  ) {}

  /**
   * A request finished well. `batchSize` items count toward inference_count;
   * queue and compute times are this request's share, as Triton reports them.
   */
  requestSucceeded(totalNs: number, batchSize: number, queueNs: number, times: ExecutionTimes): void {
    this.lastInference = Date.now();
    this.inferenceCount += batchSize;
    add(this.success, totalNs);
    add(this.queue, queueNs);
    add(this.computeInput, times.computeInputNs);
    add(this.computeInfer, times.computeInferNs);
    add(this.computeOutput, times.computeOutputNs);
    if (this.observed && observers.size > 0) {
      const sample = { model: this.name, version: this.version, totalNs, queueNs, times };
      for (const observer of observers) observer(sample);
    }
  }

  /**
   * A request that ran alone from `startNs` until now, all of it compute: one execution and one
   * success of `batchSize` items. Returns the end and the times, for the request's trace.
   */
  ranAlone(startNs: number, batchSize: number): { endNs: number; times: ExecutionTimes } {
    const endNs = nowNs();
    const times = { computeInputNs: 0, computeInferNs: endNs - startNs, computeOutputNs: 0 };
    this.executed(batchSize, times);
    this.requestSucceeded(endNs - startNs, batchSize, 0, times);
    return { endNs, times };
  }

  /** A decoupled model sent its first response to a request, `ns` after the request came. */
  firstResponse(ns: number): void {
    if (!this.observed) return;
    for (const observer of firstResponseObservers) observer({ model: this.name, version: this.version, ns });
  }

  /**
   * A request answered from the response cache in `ns` (its lookup): a success, as Triton
   * counts a hit, with no execution or inference behind it.
   */
  cacheHit(ns: number): void {
    add(this.cacheHits, ns);
    add(this.success, ns);
  }

  /** A request the cache did not hold: `ns` is its lookup plus the insertion of its answer (not the execution between). */
  cacheMiss(ns: number): void {
    add(this.cacheMisses, ns);
  }

  requestFailed(totalNs: number): void {
    this.lastInference = Date.now();
    add(this.fail, totalNs);
  }

  /**
   * Failure isolation's work (see IsolationSample): `reruns` executions run again to find a
   * failed batch's culprit, `quarantined` requests run alone in the quarantine lane.
   */
  isolated(reruns: number, quarantined: number): void {
    this.isolationCounts.reruns += reruns;
    this.isolationCounts.quarantined += quarantined;
    if (!this.observed) return;
    for (const observer of isolationObservers)
      observer({ model: this.name, version: this.version, reruns, quarantined });
  }

  /** The totals of isolated(): re-run executions and quarantined requests since the model loaded. */
  isolation(): { reruns: number; quarantined: number } {
    return { ...this.isolationCounts };
  }

  /** One model execution of `batchSize` items (one per dynamic batch). */
  executed(batchSize: number, times: ExecutionTimes): void {
    this.executionCount += 1;
    let b = this.batches.get(batchSize);
    if (!b) {
      b = { input: zero(), infer: zero(), output: zero() };
      this.batches.set(batchSize, b);
    }
    add(b.input, times.computeInputNs);
    add(b.infer, times.computeInferNs);
    add(b.output, times.computeOutputNs);
  }

  snapshot(): ModelStatistics {
    const d = (x: Duration) => create(StatisticDurationSchema, { count: BigInt(x.count), ns: BigInt(x.ns) });
    return create(ModelStatisticsSchema, {
      name: this.name,
      version: this.version,
      lastInference: BigInt(this.lastInference),
      inferenceCount: BigInt(this.inferenceCount),
      executionCount: BigInt(this.executionCount),
      inferenceStats: create(InferStatisticsSchema, {
        success: d(this.success),
        fail: d(this.fail),
        queue: d(this.queue),
        computeInput: d(this.computeInput),
        computeInfer: d(this.computeInfer),
        computeOutput: d(this.computeOutput),
        cacheHit: d(this.cacheHits),
        cacheMiss: d(this.cacheMisses),
      }),
      batchStats: [...this.batches.entries()]
        .sort(([a], [b]) => a - b)
        .map(([size, b]) =>
          create(InferBatchStatisticsSchema, {
            batchSize: BigInt(size),
            computeInput: d(b.input),
            computeInfer: d(b.infer),
            computeOutput: d(b.output),
          }),
        ),
    });
  }
}
