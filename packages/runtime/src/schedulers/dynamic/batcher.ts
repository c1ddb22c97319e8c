/**
 * A dynamic batcher in the manner of Triton's: per-request infer() calls are
 * queued by priority level, gathered into batches that respect
 * max_batch_size / preferred_batch_size / max_queue_delay_microseconds, and
 * run on up to `instances` slots at once. Each request of a batch gets its own
 * outcome: an executor either answers each request (Triton's
 * `execute(requests)`), or computes the requests merged along dim 0, its
 * outputs then split back by rows. A batch that fails is isolated
 * (bisection.ts), so only the request that caused it fails, its re-runs paid
 * from a budget (isolation.ts). Without a dynamic_batching config every
 * request runs alone through the same path (queueing, cancellation, statistics).
 *
 * This file holds the batcher itself (queueing, scheduling on instance slots, running a batch,
 * deferring a failed batch's unpaid re-runs to the quarantine lane); its priority levels are in
 * queue.ts, batch forming in batch-forming.ts, a batch's per-request answers in answers.ts.
 */
import { ConnectError } from "@connectrpc/connect";
import type { InferOptions, InferRequest, InferResponse } from "@trellis/stage";
import { Code, nowNs, StageError, type StatisticsRecorder, traceExecution } from "@trellis/stage";
import { deadlineTimer, toConnectError } from "@trellis/stage/backend";
import { answerOf } from "../answers.js";
import { abortError, type SchedulingChecks, scheduledSize } from "../checks.js";
import {
  type BatchContext,
  executionTimes,
  type RequestsExecutor,
  type RequestsResult,
  withoutTrace,
} from "../execution.js";
import { batchKey, formBatch, type NextBatch } from "./batch-forming.js";
import { DeferredRerun, isolatedRequestsExecutor, mergedExecutor } from "./bisection.js";
import { FailureIsolation } from "./isolation.js";
import {
  buildLevels,
  type DynamicBatcher,
  type DynamicBatcherOptions,
  type Level,
  type Pending,
  type QueueLevel,
  removeFrom,
} from "./queue.js";

export type {
  BatchContext,
  BatchExecutor,
  BatchResult,
  ReportedTimes,
  RequestsExecutor,
  RequestsResult,
} from "../execution.js";
export { isolatedRequestsExecutor, mergedExecutor } from "./bisection.js";
export type { BatchingStrategy, DynamicBatcher, DynamicBatcherOptions, QueueLevel } from "./queue.js";

export function createDynamicBatcher(options: DynamicBatcherOptions): DynamicBatcher {
  const isolation = new FailureIsolation(options.recorder);
  if (options.executeRequests) {
    return new Batcher(options, isolatedRequestsExecutor(options.name, options.executeRequests, isolation), isolation);
  }
  const computeBatch = options.computeBatch ?? options.execute;
  if (!computeBatch)
    throw new StageError(Code.Internal, options.name, "a batcher needs computeBatch or executeRequests");
  return new Batcher(options, mergedExecutor(options.name, computeBatch, isolation), isolation);
}

/**
 * The model runtime's batcher: `executeRequests` (a merged executor made with `isolation`)
 * reports failures to `isolation`, whose quarantined requests run alone, in their lane.
 */
export function createIsolatedBatcher(
  options: DynamicBatcherOptions,
  executeRequests: RequestsExecutor,
  isolation: FailureIsolation,
): DynamicBatcher {
  return new Batcher(options, executeRequests, isolation);
}

class Batcher implements DynamicBatcher {
  private readonly name: string;
  private readonly version: string;
  private readonly maxBatchSize: number;
  private readonly checks: SchedulingChecks;
  private readonly recorder: StatisticsRecorder;
  /** Requests merge (dynamic_batching given, and the model has a batch dimension). */
  private readonly batching: boolean;
  private readonly preferred: Set<number>;
  private readonly delayNs: number;
  private readonly levels: Level[];
  private readonly defaultIndex: number;
  /** Idle execution slots; the lowest is taken first. */
  private readonly free: number[];
  private readonly inFlight = new Set<Promise<void>>();
  private delayTimer: NodeJS.Timeout | undefined;
  private queuedCount = 0;
  /** The isolation's fatalCount when the queue was last checked for refused inputs. */
  private fatalSwept = 0;
  private closed = false;
  /** An admission is being awaited (options.admit): batches wait for it. */
  private admitting = false;
  /** schedule() as the delay timer's callback, made once: the timer is re-armed as requests arrive. */
  private readonly scheduleLater = () => this.schedule();

  constructor(
    private readonly options: DynamicBatcherOptions,
    private readonly executeRequests: RequestsExecutor,
    private readonly isolation?: FailureIsolation,
  ) {
    const { maxBatchSize, dynamicBatching: db } = options;
    this.name = options.name;
    this.recorder = options.recorder;
    this.version = options.version ?? options.recorder.version;
    this.maxBatchSize = maxBatchSize;
    this.checks = { name: this.name, maxBatchSize, validate: options.validate, isolation };
    this.batching = db !== undefined && maxBatchSize > 0;
    this.preferred = new Set((db?.preferredBatchSize ?? []).filter((n) => n > 0 && n <= maxBatchSize));
    this.delayNs = (options.strategy ?? "delay") === "eager" ? 0 : Number(db?.maxQueueDelayMicroseconds ?? 0n) * 1000;
    const instances = Math.max(1, options.instances ?? 1);
    const { levels, defaultIndex } = buildLevels(db);
    this.levels = levels;
    this.defaultIndex = defaultIndex;
    this.free = Array.from({ length: instances }, (_, i) => instances - 1 - i);
  }

  get queued(): number {
    return this.queuedCount;
  }

  get executing(): number {
    return this.inFlight.size;
  }

  queueLevel(priority?: number): QueueLevel {
    const level = this.levelOf(priority);
    return {
      number: level.number,
      maxQueueSize: level.policy.maxQueueSize,
      queued: level.queue.length + level.delayed.length,
    };
  }

  async infer(request: InferRequest, opts: InferOptions = {}): Promise<InferResponse> {
    const startNs = nowNs();
    let size: number;
    let level: Level;
    let timeoutUs: number;
    try {
      // Checked before it queues: its size, its level, its timeout there.
      size = scheduledSize(this.checks, this.closed, request, opts.signal);
      level = this.levelOf(opts.priority);
      const override = opts.timeoutMicroseconds ?? 0;
      timeoutUs = level.policy.allowOverride && override > 0 ? override : level.policy.timeoutUs;
    } catch (err) {
      this.recorder.requestFailed(nowNs() - startNs);
      throw toConnectError(err, this.name);
    }
    return new Promise<InferResponse>((resolve, reject) => {
      const p: Pending = {
        request,
        size,
        key: batchKey(this.batching, request),
        level,
        startNs,
        enqueuedNs: nowNs(),
        queueNs: 0,
        trace: opts.trace,
        options: this.options.passTrace ? opts : withoutTrace(opts),
        resolve,
        reject,
      };
      if (timeoutUs > 0) {
        p.timer = deadlineTimer(Math.max(1, Math.ceil(timeoutUs / 1000)), () => this.timedOut(p, timeoutUs));
      }
      this.watchAbort(p);
      level.queue.push(p);
      this.queuedCount += 1;
      this.schedule();
    });
  }

  /** A cancellation removes the queued request and fails it. */
  private watchAbort(p: Pending): void {
    const signal = p.options.signal;
    if (!signal) return;
    const onAbort = () => {
      this.dequeue(p);
      this.fail(p, abortError(this.name, signal));
      this.schedule();
    };
    signal.addEventListener("abort", onAbort, { once: true });
    p.detach = () => signal.removeEventListener("abort", onAbort);
  }

  /**
   * A request of a failed batch that the re-run budget could not pay to isolate: back to the head
   * of its queue, to run alone on the lane's turn (its outcome then its own), not failed for
   * another request's input. Its queue timeout already ran out or was spent waiting once.
   */
  private deferToLane(p: Pending): void {
    if (this.closed || p.options.signal?.aborted) {
      this.fail(
        p,
        this.closed
          ? new StageError(Code.Unavailable, this.name, "model is unloading")
          : abortError(this.name, p.options.signal!),
      );
      return;
    }
    p.deferred = true;
    this.watchAbort(p);
    p.level.queue.unshift(p);
    this.queuedCount += 1;
  }

  async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.delayTimer);
    for (const level of this.levels) {
      for (const p of [...level.queue, ...level.delayed]) {
        this.dequeue(p);
        this.fail(p, new StageError(Code.Unavailable, this.name, "model is unloading"));
      }
    }
    await Promise.allSettled([...this.inFlight]);
  }

  private timedOut(p: Pending, timeoutUs: number): void {
    const level = p.level;
    if (level.policy.delayOnTimeout) {
      // DELAY: still served, but after every request of this level that is within its timeout.
      if (removeFrom(level.queue, p)) level.delayed.push(p);
      this.schedule();
      return;
    }
    this.dequeue(p);
    this.fail(
      p,
      new StageError(
        Code.Unavailable,
        this.name,
        `Request timeout expired: queued longer than its timeout of ${timeoutUs} µs (priority level ${level.number})`,
      ),
    );
    this.schedule();
  }

  /** Triton's rule: levels 1..priority_levels; 0 or out of range means default_priority_level. */
  private levelOf(priority = 0): Level {
    const levels = this.levels;
    return levels[priority >= 1 && priority <= levels.length ? priority - 1 : this.defaultIndex]!;
  }

  private *ordered(): Generator<Pending> {
    for (const level of this.levels) {
      yield* level.queue;
      yield* level.delayed;
    }
  }

  private dequeue(p: Pending): void {
    if (removeFrom(p.level.queue, p) || removeFrom(p.level.delayed, p)) this.queuedCount -= 1;
    clearTimeout(p.timer);
    p.detach?.();
  }

  private fail(p: Pending, err: ConnectError): void {
    this.recorder.requestFailed(nowNs() - p.startNs);
    p.reject(err);
  }

  /**
   * The next batch to run now, the time to wait for more requests, or nothing queued. A
   * quarantined request (isolation.ts) joins no batch: it runs alone, on the lane's turn.
   */
  private nextBatch(): NextBatch {
    const isolation = this.isolation;
    // Arrivals are checked on arrival; the queue once more each time an input newly ends the instance.
    if (isolation && isolation.fatalCount !== this.fatalSwept) this.dropRefused(isolation);
    return formBatch(this.ordered(), this.batching, this.maxBatchSize, this.preferred, this.delayNs, isolation);
  }

  /** Fails the queued requests whose input ended the instance while they waited, as on arrival. */
  private dropRefused(isolation: FailureIsolation): void {
    this.fatalSwept = isolation.fatalCount;
    for (const p of [...this.ordered()]) {
      const refusal = isolation.refusal(p.request);
      if (!refusal) continue;
      this.dequeue(p);
      this.fail(p, refusal);
    }
  }

  private schedule(): void {
    clearTimeout(this.delayTimer);
    this.delayTimer = undefined;
    while (!this.closed && this.free.length > 0 && !this.admitting) {
      const next = this.nextBatch();
      if (!next) return;
      if ("waitNs" in next) {
        this.delayTimer = setTimeout(this.scheduleLater, Math.max(1, Math.ceil(next.waitNs / 1e6)));
        return;
      }
      const slot = this.free.pop()!;
      const admission = this.options.admit?.(slot);
      if (typeof admission === "function") {
        this.dispatch(next, slot, admission);
        continue;
      }
      if (admission) {
        this.admitting = true;
        void admission.then((release) => this.admitted(slot, release));
        return;
      }
      this.dispatch(next, slot);
    }
  }

  /** An awaited admission came through for `slot`. */
  private admitted(slot: number, release: () => void): void {
    this.admitting = false;
    // Formed now, so that what arrived during the wait rides along.
    const next = this.closed ? undefined : this.nextBatch();
    if (next && "batch" in next) this.dispatch(next, slot, release);
    else {
      release();
      this.free.push(slot);
    }
    this.schedule();
  }

  private dispatch(
    { batch, lane = false }: { batch: Pending[]; lane?: boolean },
    slot: number,
    release?: () => void,
  ): void {
    this.isolation?.ran(lane);
    const now = nowNs();
    for (const p of batch) {
      this.dequeue(p);
      p.queueNs = now - p.enqueuedNs;
    }
    const run = this.runBatch(batch, slot).finally(() => {
      this.isolation?.finished(lane);
      release?.();
      this.inFlight.delete(run);
      this.free.push(slot);
      this.schedule();
    });
    this.inFlight.add(run);
  }

  private async runBatch(batch: Pending[], instance: number): Promise<void> {
    const { name, recorder } = this;
    const t0 = nowNs();
    const total = batch.reduce((n, p) => n + p.size, 0);
    const context: BatchContext = {
      batchSize: total,
      requests: batch.map((p) => p.request),
      instance,
      ownsInputs: batch.length > 1,
      ...(batch.length === 1 ? { options: batch[0]!.options } : {}),
    };
    let result: RequestsResult;
    try {
      result = await this.executeRequests(context.requests, context);
      if (result.responses.length !== batch.length) {
        throw new StageError(
          Code.Internal,
          name,
          `an execution of ${batch.length} requests gave ${result.responses.length} answers`,
        );
      }
    } catch (err) {
      // Only the requests in this execution fail; the queue carries on.
      const e = toConnectError(err, name);
      for (const p of batch) this.fail(p, e);
      return;
    }
    const t1 = nowNs();
    const responses = batch.map((p, i) =>
      answerOf(name, this.version, this.maxBatchSize, p.request, p.size, result.responses[i]!, batch.length > 1),
    );
    const t2 = nowNs();
    const reported = result.times ?? {};
    const times = executionTimes(t0, t1, t2, reported);
    recorder.executed(total, times);
    batch.forEach((p, i) => {
      const r = responses[i]!;
      if (r instanceof DeferredRerun && !p.deferred) {
        this.deferToLane(p);
      } else if (r instanceof ConnectError) {
        this.fail(p, r);
      } else {
        recorder.requestSucceeded(t2 - p.startNs, p.size, p.queueNs + (reported.queueNs ?? 0), times);
        traceExecution(p.trace, p.enqueuedNs, p.enqueuedNs + p.queueNs, t2, times, total);
        p.resolve(r);
      }
    });
  }
}
