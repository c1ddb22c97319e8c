import { describe, expect, it } from "vitest";
import { closedLoop } from "../src/index.js";

describe("closedLoop", () => {
  it("keeps exactly `concurrency` calls in flight, each with its own index, and times every one", async () => {
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
    expect(r.calls).toBe(seen.length);
    expect(r.latencies).toHaveLength(r.calls);
    expect(new Set(seen).size).toBe(seen.length);
    expect(Math.min(...r.latencies)).toBeGreaterThanOrEqual(4);
    expect(r.seconds).toBeGreaterThanOrEqual(0.1);
  });
});
