/**
 * A FIFO counting semaphore whose waiters can be aborted: the per-step cap
 * behind `max_inflight_requests`.
 */

interface Waiter {
  resolve(): void;
  reject(reason: unknown): void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

export class Limiter {
  private active = 0;
  private readonly waiters: Waiter[] = [];

  /** `limit` 0 means unlimited. */
  constructor(readonly limit: number) {}

  /** Permits held now. */
  get inflight(): number {
    return this.active;
  }

  /** Requests waiting for a permit now. */
  get waiting(): number {
    return this.waiters.length;
  }

  /** Resolves once a permit is held; rejects with the signal's reason if aborted first. */
  acquire(signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.limit === 0 || (this.active < this.limit && this.waiters.length === 0)) {
      this.active += 1;
      return Promise.resolve();
    }
    return new Promise<void>((resolve, reject) => {
      const waiter: Waiter = { resolve, reject, signal };
      if (signal) {
        waiter.onAbort = () => {
          const i = this.waiters.indexOf(waiter);
          if (i >= 0) this.waiters.splice(i, 1);
          reject(signal.reason);
        };
        signal.addEventListener("abort", waiter.onAbort, { once: true });
      }
      this.waiters.push(waiter);
    });
  }

  release(): void {
    const next = this.waiters.shift();
    if (next) {
      // The permit passes straight to the next waiter, so `active` is unchanged.
      if (next.onAbort) next.signal?.removeEventListener("abort", next.onAbort);
      next.resolve();
      return;
    }
    this.active -= 1;
  }
}
