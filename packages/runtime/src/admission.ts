/**
 * The runtime's admission: the one place a request is refused because its model's queue is
 * full, as Triton's core refuses one (UNAVAILABLE, "Exceeds maximum queue size"), before any
 * work is done on it. Which bound applies, first that binds:
 * 1. the max_queue_size of the request's priority level (dynamic_batching's queue policy),
 *    counting the requests queued at that level;
 * 2. a config with no max_queue_size gets the server's --default-max-queue-size, counting every
 *    request the model holds pending (queued, or in flight where nothing queues);
 * 3. a backend's own bound on the requests in flight (an ensemble: its tightest step's), so a
 *    later step never refuses what an earlier one computed.
 */
import type { ModelConfig } from "@trellis/protocol";
import type { StageError } from "@trellis/stage";
import { configMaxQueueSize, queueFullRefusal } from "@trellis/stage/backend";
import type { QueueLevel } from "./schedulers/dynamic/batcher.js";

/** A backend's bound on the requests it holds in flight (0: none), and what sets it, for the refusal. */
export interface QueueBound {
  bound: number;
  what: string;
}

export interface AdmissionOptions {
  config: ModelConfig;
  /** The server's bound for a config that sets no max_queue_size (0 or absent: unbounded). */
  defaultMaxQueueSize?: number;
  /** The queue a request of this priority joins. */
  level(priority?: number): QueueLevel;
  /** Requests the model holds pending now (queued; or in flight, for a model that does not queue). */
  pending(): number;
  /** Requests admitted and not yet answered. */
  inflight(): number;
  /** The backend's own bound on requests in flight. */
  backendBound?(): QueueBound;
}

export class Admission {
  /** What the config's queue policies allow pending, every level together (undefined: they set none). */
  private readonly configBound: number | undefined;
  /** The bound that applies when the config sets no max_queue_size; 0: none. */
  private readonly defaultBound: number;

  constructor(private readonly options: AdmissionOptions) {
    this.configBound = configMaxQueueSize(options.config);
    this.defaultBound = this.configBound === undefined ? Math.max(0, options.defaultMaxQueueSize ?? 0) : 0;
  }

  /** The refusal of a request of this priority, when a bound is reached; undefined: admitted. */
  refusal(priority?: number): StageError | undefined {
    const name = this.options.config.name;
    const level = this.options.level(priority);
    if (level.maxQueueSize > 0 && level.queued >= level.maxQueueSize) {
      return queueFullRefusal(
        name,
        `${level.queued} requests already queued`,
        `the max_queue_size of priority level ${level.number}`,
      );
    }
    if (this.defaultBound > 0) {
      const pending = this.options.pending();
      if (pending >= this.defaultBound) {
        return queueFullRefusal(
          name,
          `${pending} requests already pending`,
          `the server's default bound (--default-max-queue-size) ${this.defaultBound}`,
        );
      }
    }
    const own = this.options.backendBound?.();
    if (own && own.bound > 0) {
      const inflight = this.options.inflight();
      if (inflight >= own.bound) return queueFullRefusal(name, `${inflight} requests in flight`, own.what);
    }
    return undefined;
  }

  /**
   * The most requests the model holds pending before refusing more (0: unbounded): its config's
   * (every level together), else the server's default, the backend's own when tighter. An
   * ensemble admits no more than its tightest step's.
   */
  maxQueueSize(): number {
    const config = this.configBound ?? this.defaultBound;
    const own = this.options.backendBound?.().bound ?? 0;
    if (config === 0) return own;
    return own > 0 ? Math.min(own, config) : config;
  }
}
