/**
 * What a backend's model instances share with the rest of the server, handed in
 * by whoever loads the model (see StageFactoryOptions): the rate limiter and the
 * CPU gate. Interfaces only; @trellis/runtime implements both.
 */

/** One entry of an instance's rate_limiter resources. */
export interface RateLimiterResource {
  name: string;
  count: number;
}

/** What one model instance asks of the rate limiter (instance_group's rate_limiter). */
export interface RateLimitedInstance {
  /** The model, for errors. */
  model: string;
  resources: RateLimiterResource[];
  /** Triton's priority: 0 or 1 is the default weight; n gets 1/n of the chances. */
  priority: number;
}

/** An instance's place in the rate limiter. */
export interface RateLimiterSlot {
  /** The release function once the instance may run (at once when it can be had without waiting). */
  admit(): (() => void) | Promise<() => void>;
  /** Leaves the rate limiter (the model is unloaded); resources it holds are released by their release functions. */
  unregister(): void;
}

/** Triton's rate limiter as a backend sees it: each instance registers once, then asks before each run. */
export interface RateLimiter {
  register(instance: RateLimitedInstance): RateLimiterSlot;
}

/**
 * The process's CPU, shared by the stages that use every core (an ONNX session whose
 * threads cover them runs exclusively) and those that use one at a time (an image
 * decode runs shared): each acquire gives the function that releases it.
 */
export interface CpuGate {
  tryAcquireShared(): (() => void) | undefined;
  acquireShared(): Promise<() => void>;
  tryAcquireExclusive(): (() => void) | undefined;
  acquireExclusive(maxSharedWaitMs?: number): Promise<() => void>;
}
