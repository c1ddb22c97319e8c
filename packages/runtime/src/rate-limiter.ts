/**
 * Triton's rate limiter (--rate-limit execution_count): model instances that
 * list resources in instance_group's rate_limiter run only while that many of
 * each are free, across every model in the server, and among instances
 * waiting, priority decides who runs next (an instance with priority 2 gets
 * half the chances of one with priority 1). A resource's count is the
 * --rate-limit-resource given for it, else the most any loaded instance needs.
 */

import type { RateLimiter as RateLimiterContract } from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";
import type { RateLimitedInstance, RateLimiterResource, RateLimiterSlot } from "@trellis/stage/backend";

interface Registered extends RateLimitedInstance {
  /** Executions granted so far: with the priority, the order among waiters. */
  executions: number;
}

interface Waiter {
  instance: Registered;
  arrived: number;
  grant(release: () => void): void;
}

export class RateLimiter implements RateLimiterContract {
  private readonly instances = new Set<Registered>();
  private readonly inUse = new Map<string, number>();
  private waiters: Waiter[] = [];
  private arrivals = 0;

  /** @param given resource counts from the command line (--rate-limit-resource name:count), by name. */
  constructor(private readonly given: Readonly<Record<string, number>> = {}) {}

  /** Resources available: the given count, else the most any registered instance needs. */
  available(name: string): number {
    const given = this.given[name];
    if (given !== undefined) return given;
    let most = 0;
    for (const i of this.instances) for (const r of i.resources) if (r.name === name) most = Math.max(most, r.count);
    return most;
  }

  /**
   * Adds an instance. One needing more of a resource than the command line gives
   * can never run: that is refused here, naming both counts, as Triton refuses the load.
   */
  register(instance: RateLimitedInstance): RateLimiterSlot {
    for (const r of instance.resources) {
      const given = this.given[r.name];
      if (given !== undefined && r.count > given) {
        throw new StageError(
          Code.InvalidArgument,
          instance.model,
          `rate_limiter resource ${r.name}: an instance needs ${r.count}, but --rate-limit-resource gives ${given}`,
        );
      }
    }
    const entry: Registered = { ...instance, executions: 0 };
    this.instances.add(entry);
    return {
      admit: () => this.admit(entry),
      unregister: () => {
        this.instances.delete(entry);
        this.waiters = this.waiters.filter((w) => w.instance !== entry);
        // Defaults may have shrunk or grown: let whoever fits now run.
        this.grant();
      },
    };
  }

  private fits(instance: Registered): boolean {
    return instance.resources.every((r) => (this.inUse.get(r.name) ?? 0) + r.count <= this.available(r.name));
  }

  private take(instance: Registered): () => void {
    instance.executions++;
    for (const r of instance.resources) this.inUse.set(r.name, (this.inUse.get(r.name) ?? 0) + r.count);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      for (const r of instance.resources) this.inUse.set(r.name, (this.inUse.get(r.name) ?? 0) - r.count);
      this.grant();
    };
  }

  private admit(instance: Registered): (() => void) | Promise<() => void> {
    // At once when it fits and no waiter wants what it needs (else it queues, so waiters are not overtaken).
    const contended = this.waiters.some((w) =>
      w.instance.resources.some((r) => instance.resources.some((mine) => mine.name === r.name)),
    );
    if (!contended && this.fits(instance)) return this.take(instance);
    return new Promise((resolve) => {
      this.waiters.push({ instance, arrived: this.arrivals++, grant: resolve });
      this.grant();
    });
  }

  /** Lets waiters run while resources allow: the fewest weighted executions first, then the earliest. */
  private grant(): void {
    for (;;) {
      let next: Waiter | undefined;
      for (const w of this.waiters) {
        if (!this.fits(w.instance)) continue;
        if (!next || rank(w) < rank(next) || (rank(w) === rank(next) && w.arrived < next.arrived)) next = w;
      }
      if (!next) return;
      this.waiters = this.waiters.filter((w) => w !== next);
      next.grant(this.take(next.instance));
    }
  }
}

/** Triton's execution_count order: executions weighted by priority (0 counts as 1). */
const rank = (w: Waiter) => (w.instance.executions + 1) * Math.max(1, w.instance.priority);

/** The resources a config's instance group lists, as the rate limiter takes them. */
export function rateLimiterResources(
  rateLimiter: { resources: { name: string; count: number }[]; priority: number } | undefined,
): { resources: RateLimiterResource[]; priority: number } {
  return {
    resources: (rateLimiter?.resources ?? []).filter((r) => r.count > 0).map((r) => ({ name: r.name, count: r.count })),
    priority: rateLimiter?.priority ?? 0,
  };
}
