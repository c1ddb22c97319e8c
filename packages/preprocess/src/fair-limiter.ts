/**
 * A counting semaphore that bounds decodes in flight (memory: a 4000x3000 decode is 36 MB)
 * and hands each freed slot to the waiting owners in turn, not in arrival order: a request
 * of many expensive images gets one slot of each round, so a one-image request sent after it
 * waits for one decode, not for all of them.
 */
export class FairLimiter {
  private active = 0;
  /** Waiting tasks by owner; the map's order is the rotation (an owner served goes last). */
  private readonly waiting = new Map<object, (() => void)[]>();

  constructor(private readonly limit: number) {}

  /** Runs `fn` once a slot is free and it is `owner`'s turn. */
  async run<T>(owner: object, fn: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) {
      await new Promise<void>((resolve) => {
        const queue = this.waiting.get(owner);
        if (queue) queue.push(resolve);
        else this.waiting.set(owner, [resolve]);
      });
    } else this.active++;
    try {
      return await fn();
    } finally {
      this.next();
    }
  }

  /** A slot is free: it goes to the first owner in the rotation, which then goes last. */
  private next(): void {
    const first = this.waiting.entries().next();
    if (first.done) {
      this.active--;
      return;
    }
    const [owner, queue] = first.value;
    this.waiting.delete(owner);
    const resolve = queue.shift() as () => void;
    if (queue.length > 0) this.waiting.set(owner, queue);
    // The slot passes straight to the task resumed: `active` stays as it is.
    resolve();
  }
}
