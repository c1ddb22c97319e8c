import { describe, expect, it } from "vitest";
import { CpuGate } from "../src/cpu-gate.js";

/** Lets every pending promise callback run. */
const settle = () => new Promise<void>((r) => setImmediate(r));

describe("CpuGate", () => {
  it("lets shared holders in together", async () => {
    const gate = new CpuGate();
    const a = await gate.acquireShared();
    const b = await gate.acquireShared();
    expect(gate.sharedHolders).toBe(2);
    a();
    b();
    expect(gate.sharedHolders).toBe(0);
  });

  it("makes an exclusive acquirer wait for the shared holders, and shared acquirers wait for it", async () => {
    const gate = new CpuGate();
    const events: string[] = [];
    const decode = await gate.acquireShared();
    const run = gate.acquireExclusive().then((release) => {
      events.push("run");
      return release;
    });
    // A decode arriving while the run waits goes after it: a stream of decodes cannot starve inference.
    const late = gate.acquireShared().then((release) => {
      events.push("late decode");
      return release;
    });
    await settle();
    expect(events).toEqual([]);
    decode();
    const releaseRun = await run;
    await settle();
    expect(events).toEqual(["run"]);
    expect(gate.heldExclusively).toBe(true);
    releaseRun();
    (await late)();
    expect(events).toEqual(["run", "late decode"]);
  });

  it("admits every decode that waited during a run at once, before the next run", async () => {
    const gate = new CpuGate();
    const first = await gate.acquireExclusive();
    const order: string[] = [];
    const decodes = [1, 2, 3].map((i) =>
      gate.acquireShared().then((release) => {
        order.push(`decode ${i}`);
        return release;
      }),
    );
    const second = gate.acquireExclusive().then((release) => {
      order.push("run 2");
      return release;
    });
    await settle();
    first();
    const released = await Promise.all(decodes);
    await settle();
    expect(order).toEqual(["decode 1", "decode 2", "decode 3"]);
    expect(gate.sharedHolders).toBe(3);
    for (const release of released) release();
    (await second)();
    expect(order.at(-1)).toBe("run 2");
  });

  it("serves exclusive acquirers in order, one at a time", async () => {
    const gate = new CpuGate();
    const order: number[] = [];
    const runs = [1, 2, 3].map((i) =>
      gate.withExclusive(async () => {
        order.push(i);
        expect(gate.heldExclusively).toBe(true);
        await settle();
        order.push(-i);
      }),
    );
    await Promise.all(runs);
    expect(order).toEqual([1, -1, 2, -2, 3, -3]);
  });

  it("ignores a second call of a release function", async () => {
    const gate = new CpuGate();
    const a = await gate.acquireShared();
    await gate.acquireShared();
    a();
    a();
    expect(gate.sharedHolders).toBe(1);
  });
});

describe("CpuGate with a bounded wait for shared holders", () => {
  it("takes the gate alongside a slow shared holder after maxSharedWaitMs, and still keeps new shared acquirers out", async () => {
    const gate = new CpuGate();
    const slowDecode = await gate.acquireShared();
    const t0 = performance.now();
    const release = await gate.acquireExclusive(30);
    expect(performance.now() - t0).toBeGreaterThanOrEqual(25);
    expect(gate.heldExclusively).toBe(true);
    expect(gate.sharedHolders).toBe(1);
    let late = false;
    const lateDecode = gate.acquireShared().then((r) => {
      late = true;
      return r;
    });
    slowDecode();
    await settle();
    // The slow holder left, but the exclusive holder still has the gate.
    expect(late).toBe(false);
    expect(gate.heldExclusively).toBe(true);
    release();
    (await lateDecode)();
    expect(late).toBe(true);
    expect([gate.sharedHolders, gate.heldExclusively]).toEqual([0, false]);
  });

  it("waits its turn behind another exclusive holder whatever its bound", async () => {
    const gate = new CpuGate();
    const first = await gate.acquireExclusive();
    let second = false;
    const waiting = gate.acquireExclusive(10).then((r) => {
      second = true;
      return r;
    });
    await new Promise((r) => setTimeout(r, 40));
    expect(second).toBe(false);
    first();
    (await waiting)();
    expect(second).toBe(true);
  });
});
