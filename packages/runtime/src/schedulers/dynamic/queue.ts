/**
 * The dynamic batcher's options and its queue: what configures it (batching strategy,
 * executors, admission), the DynamicBatcher it gives, a priority level's queue as the runtime's
 * admission checks it; then the levels with their queue policies (Triton's per-level
 * max_queue_size, default timeout and timeout_action), the pending requests they hold, and the
 * small helpers the batcher uses on them.
 */
import type { ConnectError } from "@connectrpc/connect";
import { type ModelDynamicBatching, type ModelQueuePolicy, ModelQueuePolicy_TimeoutAction } from "@trellis/protocol";
import type { InferOptions, InferRequest, InferResponse, RequestTrace, StatisticsRecorder } from "@trellis/stage";
import type { BatchExecutor, RequestsExecutor } from "../execution.js";
import type { Scheduler } from "../scheduler.js";

export type BatchingStrategy = "delay" | "eager";

export interface DynamicBatcherOptions {
  /** Model name: prefixes errors and fills InferResponse.modelName. */
  name: string;
  /** Model version for responses; defaults to the recorder's. */
  version?: string;
  /** config.max_batch_size; 0 means the model has no batch dimension (requests never merge). */
  maxBatchSize: number;
  /** config.dynamic_batching; absent means every request executes alone, in arrival order. */
  dynamicBatching?: ModelDynamicBatching;
  /** Executions allowed in flight at once (instance_group count); default 1. */
  instances?: number;
  /** How a batch is computed: merged (`computeBatch`), or request by request (`executeRequests`); give one. */
  computeBatch?: BatchExecutor;
  /** @deprecated renamed `computeBatch` (the same executor); still read when `computeBatch` is absent. */
  execute?: BatchExecutor;
  executeRequests?: RequestsExecutor;
  /**
   * "delay" (default, Triton's rule): a batch short of a preferred size (or of
   * max_batch_size) waits up to max_queue_delay for more requests, even while
   * instances sit idle (a lone request waits the full delay); with no delay it
   * runs at once. "eager": an idle instance takes whatever is queued at once,
   * whatever the delay, so batches form only while every instance is busy.
   */
  strategy?: BatchingStrategy;
  /**
   * Hand a lone request's trace to the executor (an ensemble stamps its steps on it); the
   * batcher still stamps the execution itself. Default: the trace stays with the batcher.
   */
  passTrace?: boolean;
  /** Checks one request before it is queued, so a bad request fails alone (throw a StageError). */
  validate?: (request: InferRequest) => void;
  /**
   * Called before each batch is formed, with the instance that will run it; gives
   * (at once, or once it resolves) a function called when that execution ends.
   * While it is awaited, arriving requests join the batch. For holding a CpuGate
   * exclusively during runs that use every core, and for the rate limiter.
   */
  admit?: (instance: number) => (() => void) | Promise<() => void>;
  recorder: StatisticsRecorder;
}

export type { QueueLevel } from "../scheduler.js";

export interface DynamicBatcher extends Scheduler {
  /** Executions in flight. */
  readonly executing: number;
}

export interface Policy {
  maxQueueSize: number;
  timeoutUs: number;
  delayOnTimeout: boolean;
  allowOverride: boolean;
}

export interface Level {
  number: number;
  policy: Policy;
  queue: Pending[];
  /** Requests whose timeout expired under timeout_action DELAY: served after this level's queue. */
  delayed: Pending[];
}

export interface Pending {
  request: InferRequest;
  size: number;
  key: string;
  level: Level;
  startNs: number;
  enqueuedNs: number;
  queueNs: number;
  trace?: RequestTrace;
  options: InferOptions;
  timer?: NodeJS.Timeout;
  detach?: () => void;
  /** Sent back from a failed batch the re-run budget could not pay to isolate: it runs alone, in the lane. */
  deferred?: boolean;
  resolve(response: InferResponse): void;
  reject(err: ConnectError): void;
}

function resolvePolicy(p: ModelQueuePolicy | undefined): Policy {
  return {
    maxQueueSize: p?.maxQueueSize ?? 0,
    timeoutUs: Number(p?.defaultTimeoutMicroseconds ?? 0n),
    delayOnTimeout: p?.timeoutAction === ModelQueuePolicy_TimeoutAction.DELAY,
    allowOverride: p?.allowTimeoutOverride ?? false,
  };
}

/** Triton's rule: levels 1..priority_levels; 0 or out of range means default_priority_level. */
export function buildLevels(db: ModelDynamicBatching | undefined): { levels: Level[]; defaultIndex: number } {
  const count = Math.max(1, Number(db?.priorityLevels ?? 0n));
  const levels: Level[] = [];
  for (let n = 1; n <= count; n++) {
    const specific = count > 1 ? db?.priorityQueuePolicy[String(n)] : undefined;
    levels.push({ number: n, policy: resolvePolicy(specific ?? db?.defaultQueuePolicy), queue: [], delayed: [] });
  }
  const def = Number(db?.defaultPriorityLevel ?? 0n);
  return { levels, defaultIndex: def >= 1 && def <= count ? def - 1 : 0 };
}

export const removeFrom = (list: Pending[], p: Pending) => {
  const i = list.indexOf(p);
  if (i >= 0) list.splice(i, 1);
  return i >= 0;
};
