import { describe, expect, it, vi } from "vitest";
import { closedLoop, median, percentile } from "../src/index.js";

describe("closedLoop", () => {
  it("keeps exactly `concurrency` calls in flight, each with its own index, and times each one it counts", async () => {
    let inFlight = 0;
    let most = 0;
    const seen: number[] = [];
    const r = await closedLoop(
      async (i) => {
        seen.push(i);
        most = Math.max(most, ++inFlight);
        await new Promise((resolve) => setTimeout(resolve, 5));
        inFlight--;
      },
      3,
      0.1,
    );
    expect(most).toBe(3);
    // Calls still running when the window closes (at most one per caller) are not counted.
    expect(r.calls).toBeLessThanOrEqual(seen.length);
    expect(r.calls).toBeGreaterThanOrEqual(seen.length - 3);
    expect(r.latencies).toHaveLength(r.calls);
    expect(new Set(seen).size).toBe(seen.length);
    expect(Math.min(...r.latencies)).toBeGreaterThanOrEqual(4);
    expect(r.seconds).toBe(0.1);
  });

  it("counts only the calls answered inside the window after the warm-up, and awaits the rest", async () => {
    // Fake clocks: the count is the code's, not the machine's load.
    vi.useFakeTimers({ toFake: ["setTimeout", "performance"] });
    try {
      let started = 0;
      let finished = 0;
      const loop = closedLoop(
        async () => {
          started++;
          await new Promise((resolve) => setTimeout(resolve, 20));
          finished++;
        },
        1,
        0.2,
        { warmupSeconds: 0.1 },
      );
      await vi.advanceTimersByTimeAsync(400);
      const r = await loop;
      expect(r.seconds).toBe(0.2);
      // Calls of 20 ms from 0 ms: answered at 20, 40, …; the window is [100, 300] ms after the
      // start, so the 11 answered at 100…300 count, the 4 of the warm-up do not.
      expect(r.calls).toBe(11);
      expect(started - r.calls).toBe(4);
      expect(r.latencies.every((l) => l === 20)).toBe(true);
      expect(finished).toBe(started);
    } finally {
      vi.useRealTimers();
    }
  });
});

describe("median and percentile", () => {
  it("take the middle (mean of the middle two for an even count) and the nearest rank", () => {
    expect(median([3, 1, 2])).toBe(2);
    expect(median([4, 1, 3, 2])).toBe(2.5);
    expect(percentile([5, 1, 4, 2, 3], 50)).toBe(3);
    expect(percentile([5, 1, 4, 2, 3], 99)).toBe(5);
    expect(Number.isNaN(median([]))).toBe(true);
  });
});
