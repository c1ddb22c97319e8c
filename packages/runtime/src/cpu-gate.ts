/**
 * Time-sharing of the CPU between stages in one process. An ONNX Runtime
 * run on the CPU splits each operator across a thread per core; another busy
 * thread (an image decode) on any core makes that core's share the straggler
 * every operator waits for, so the run slows by more than the decode's own
 * CPU time. Runs that use every core therefore hold the gate exclusively and
 * decodes hold it shared: decodes run together between runs, not under them.
 *
 * Exclusive holders go first: a shared acquirer waits while one holds the
 * gate or waits for it, so a stream of decodes cannot starve inference, and
 * when a run ends every decode waiting at that moment is let in at once
 * (those requests then make the next batch). An exclusive acquirer can bound
 * its wait for shared holders (a 40-megapixel JPEG takes ~0.13 s to
 * decode): past it, it runs alongside them rather than idle the cores.
 */
import type { CpuGate as CpuGateContract } from "@trellis/stage";

type Wake = () => void;

export class CpuGate implements CpuGateContract {
  private shared = 0;
  private exclusive = false;
  private readonly exclusiveWaiters: Wake[] = [];
  private sharedWaiters: Wake[] = [];

  /** Holders of the shared side right now. */
  get sharedHolders(): number {
    return this.shared;
  }

  /** Whether an exclusive holder has the gate right now. */
  get heldExclusively(): boolean {
    return this.exclusive;
  }

  /** The shared side's release function if it can be had without waiting, else undefined. */
  tryAcquireShared(): (() => void) | undefined {
    if (this.exclusive || this.exclusiveWaiters.length > 0) return undefined;
    this.shared++;
    return this.sharedRelease();
  }

  /** Waits for the shared side; resolves to the release function (call it once). */
  async acquireShared(): Promise<() => void> {
    const now = this.tryAcquireShared();
    if (now) return now;
    await queueFor(this.sharedWaiters);
    return this.sharedRelease();
  }

  private sharedRelease(): () => void {
    return once(() => {
      this.shared--;
      // With an exclusive holder that stopped waiting for us, the gate is not free yet.
      if (this.shared === 0 && !this.exclusive) this.handOver();
    });
  }

  /** The exclusive side's release function if the gate is free, else undefined. */
  tryAcquireExclusive(): (() => void) | undefined {
    if (this.exclusive || this.shared > 0 || this.exclusiveWaiters.length > 0) return undefined;
    this.exclusive = true;
    return this.exclusiveRelease();
  }

  /**
   * Waits until nothing else holds the gate; resolves to the release function
   * (call it once). Once first in line, it waits at most `maxSharedWaitMs` for
   * the shared holders to finish, then takes the gate while they do.
   */
  async acquireExclusive(maxSharedWaitMs = Number.POSITIVE_INFINITY): Promise<() => void> {
    const now = this.tryAcquireExclusive();
    if (now) return now;
    await new Promise<void>((wake) => {
      let timer: NodeJS.Timeout | undefined;
      const waiter = () => {
        clearTimeout(timer);
        wake();
      };
      this.exclusiveWaiters.push(waiter);
      if (!Number.isFinite(maxSharedWaitMs)) return;
      const check = () => {
        // Only past shared holders: behind another exclusive holder it keeps its place, and looks again later.
        if (this.exclusive || this.exclusiveWaiters[0] !== waiter) {
          timer = setTimeout(check, maxSharedWaitMs).unref();
          return;
        }
        this.exclusiveWaiters.shift();
        this.exclusive = true;
        wake();
      };
      timer = setTimeout(check, maxSharedWaitMs).unref();
    });
    return this.exclusiveRelease();
  }

  private exclusiveRelease(): () => void {
    return once(() => {
      this.exclusive = false;
      // Decodes that queued during the run go next, all together; then the next run.
      if (this.sharedWaiters.length > 0) this.admitShared();
      else this.handOver();
    });
  }

  /** Runs `fn` holding the shared side. */
  withShared<T>(fn: () => Promise<T>): Promise<T> {
    return holding(this.acquireShared(), fn);
  }

  /** Runs `fn` holding the gate exclusively. */
  withExclusive<T>(fn: () => Promise<T>): Promise<T> {
    return holding(this.acquireExclusive(), fn);
  }

  /** The gate is free once the shared holders are done: the next exclusive waiter, else every shared waiter. */
  private handOver(): void {
    if (this.shared > 0) return;
    const next = this.exclusiveWaiters.shift();
    if (next) {
      this.exclusive = true;
      next();
    } else if (this.sharedWaiters.length > 0) {
      this.admitShared();
    }
  }

  private admitShared(): void {
    const admitted = this.sharedWaiters;
    this.sharedWaiters = [];
    this.shared += admitted.length;
    for (const wake of admitted) wake();
  }
}

/** Resolves when the waiter queued here is woken. */
const queueFor = (waiters: Wake[]) => new Promise<void>((wake) => waiters.push(wake));

async function holding<T>(acquired: Promise<() => void>, fn: () => Promise<T>): Promise<T> {
  const release = await acquired;
  try {
    return await fn();
  } finally {
    release();
  }
}

function once(fn: () => void): () => void {
  let done = false;
  return () => {
    if (done) return;
    done = true;
    fn();
  };
}
