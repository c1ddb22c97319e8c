/**
 * What a Model hands its requests to once they are admitted: the scheduler its config chooses
 * (Triton's schedulers). `dynamic/`: queued by priority and, with dynamic_batching, merged; a
 * model without it runs each request alone through the same queue (Triton's default scheduler).
 * `direct.ts`: no queue at all, for a backend that bounds its own work (an ensemble, a remote
 * model). `sequence/` sits in front of the dynamic one, routing each sequence to its slot.
 */
import type { InferOptions, InferRequest, InferResponse } from "@trellis/stage";

/** A priority level's queue, as the runtime's admission checks it (Triton's max_queue_size is per level). */
export interface QueueLevel {
  number: number;
  /** The level's queue policy max_queue_size; 0: unbounded by the config. */
  maxQueueSize: number;
  queued: number;
}

export interface Scheduler {
  /** Checks the request, runs it on the backend and records it in the model's statistics. */
  infer(request: InferRequest, options?: InferOptions): Promise<InferResponse>;
  /** The level a request of this priority queues at. */
  queueLevel(priority?: number): QueueLevel;
  /** Requests waiting in its queue (not executing). */
  readonly queued: number;
  /** Fails queued requests with UNAVAILABLE and waits for executions in flight. */
  close(): Promise<void>;
}
