import { describe, expect, it } from "vitest";
import { RateLimiter, rateLimiterResources } from "../src/rate-limiter.js";

const resolved = async <T>(value: T | Promise<T>): Promise<T> => value;

describe("RateLimiter", () => {
  it("counts each resource as the most any instance needs, unless given, and refuses an instance that could never run", () => {
    const limiter = new RateLimiter({ R2: 3 });
    limiter.register({ model: "a", resources: [{ name: "R1", count: 4 }], priority: 0 });
    limiter.register({
      model: "b",
      resources: [
        { name: "R1", count: 1 },
        { name: "R2", count: 2 },
      ],
      priority: 0,
    });
    expect(limiter.available("R1")).toBe(4);
    expect(limiter.available("R2")).toBe(3);
    expect(() => limiter.register({ model: "c", resources: [{ name: "R2", count: 5 }], priority: 0 })).toThrow(
      "rate_limiter resource R2: an instance needs 5, but --rate-limit-resource gives 3",
    );
  });

  it("runs instances only while their resources are free, at once when they are", async () => {
    const limiter = new RateLimiter();
    const a = limiter.register({ model: "a", resources: [{ name: "R", count: 2 }], priority: 0 });
    const b = limiter.register({ model: "b", resources: [{ name: "R", count: 1 }], priority: 0 });
    const free = rateLimiterResources(undefined);
    const c = limiter.register({ model: "c", ...free });

    const releaseA = a.admit();
    expect(typeof releaseA).toBe("function"); // had at once: no wait, no promise
    let bRunning = false;
    const bAdmitted = resolved(b.admit()).then((release) => {
      bRunning = true;
      return release;
    });
    // An instance listing no resources is never held back.
    expect(typeof c.admit()).toBe("function");
    await new Promise((r) => setTimeout(r, 10));
    expect(bRunning).toBe(false);
    (releaseA as () => void)();
    (await bAdmitted)();
    expect(bRunning).toBe(true);
  });

  it("gives an instance with priority 2 half the turns of one with priority 1 when both always wait", async () => {
    const limiter = new RateLimiter();
    const resources = [{ name: "GPU", count: 1 }];
    const high = limiter.register({ model: "high", resources, priority: 1 });
    const low = limiter.register({ model: "low", resources, priority: 2 });
    const turns: string[] = [];
    let hold = resolved(high.admit());
    turns.push("high");
    // Both keep asking again as soon as they have run: the order the limiter grants them is the schedule.
    const queue = (name: string, slot: typeof high) => {
      const next = resolved(slot.admit()).then((release) => {
        turns.push(name);
        return release;
      });
      return next;
    };
    let pendingHigh = queue("high", high);
    let pendingLow = queue("low", low);
    for (let i = 0; i < 30; i++) {
      (await hold)();
      hold = Promise.race([
        pendingHigh.then((r) => ({ r, who: "high" })),
        pendingLow.then((r) => ({ r, who: "low" })),
      ]).then(({ r, who }) => {
        if (who === "high") pendingHigh = queue("high", high);
        else pendingLow = queue("low", low);
        return r;
      });
      await hold;
    }
    const highTurns = turns.filter((t) => t === "high").length;
    const lowTurns = turns.filter((t) => t === "low").length;
    expect(highTurns / lowTurns).toBeGreaterThan(1.7);
    expect(highTurns / lowTurns).toBeLessThan(2.3);
  });

  it("lets a waiting instance in when another unregisters and the default count grows to fit it", async () => {
    const limiter = new RateLimiter();
    const big = limiter.register({ model: "big", resources: [{ name: "R", count: 3 }], priority: 0 });
    const small = limiter.register({ model: "small", resources: [{ name: "R", count: 1 }], priority: 0 });
    const release = big.admit() as () => void;
    const waiting = resolved(small.admit());
    big.unregister(); // unloaded while running: its run still holds R until it ends
    expect(limiter.available("R")).toBe(1);
    release();
    expect(typeof (await waiting)).toBe("function");
  });
});
