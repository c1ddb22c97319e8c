import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { ModelDynamicBatchingSchema, ModelQueuePolicy_TimeoutAction, ModelQueuePolicySchema } from "@trellis/protocol";
import type { InferOptions, InferRequest, InferResponse } from "@trellis/stage";
import { Code, StageError, StatisticsRecorder, type Tensor, tensor } from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { describe, expect, it } from "vitest";
import { CpuGate } from "../src/cpu-gate.js";
import { type BatchContext, type BatchingStrategy, createDynamicBatcher } from "../src/schedulers/dynamic/batcher.js";

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A request of `rows` items of input x [rows, width], values seeded so every row is distinct. */
function req(rows: number, seed: number, width = 2, id?: string): InferRequest {
  const data = Float32Array.from({ length: rows * width }, (_, i) => seed * 1000 + i + 0.25);
  return { id, inputs: [tensor("x", "FP32", [rows, width], data)] };
}

/**
 * A batcher over a tiny executor: y = 2x, plus n = the execution's batch size
 * per row. `hold()` makes the next executions wait for `release()`, so tests
 * pile up a queue deterministically instead of racing timers.
 */
function harness(
  maxBatchSize: number,
  db?: MessageInitShape<typeof ModelDynamicBatchingSchema>,
  extra: { instances?: number; strategy?: BatchingStrategy; admit?: () => Promise<() => void> } = {},
) {
  const executions: { sizes: number[]; ids: (string | undefined)[]; instance: number }[] = [];
  let gate: Promise<void> | undefined;
  let open: (() => void) | undefined;
  let running = 0;
  let maxRunning = 0;
  const recorder = new StatisticsRecorder("toy", "1");
  const batcher = createDynamicBatcher({
    name: "toy",
    maxBatchSize,
    dynamicBatching: db ? create(ModelDynamicBatchingSchema, db) : undefined,
    instances: extra.instances,
    // Most cases here pin down Triton's delay rule; the eager default has its own test.
    strategy: extra.strategy ?? "delay",
    ...(extra.admit ? { admit: extra.admit } : {}),
    recorder,
    validate: (r) => {
      for (const t of r.inputs) {
        if (t.name !== "x") throw new StageError(Code.InvalidArgument, "toy", `unknown input ${t.name}`);
      }
    },
    computeBatch: async (batch: InferRequest, ctx: BatchContext) => {
      executions.push({
        sizes: ctx.requests.map((r) => r.inputs[0]!.shape[0]!),
        ids: ctx.requests.map((r) => r.id),
        instance: ctx.instance,
      });
      running += 1;
      maxRunning = Math.max(maxRunning, running);
      try {
        if (gate) await gate;
        const x = batch.inputs[0]!;
        if (x.shape[1] === 3) throw new Error("executor refuses width 3");
        const y = Float32Array.from(x.data as Float32Array, (v) => v * 2);
        const n = new Int32Array(x.shape[0]!).fill(ctx.batchSize);
        return { outputs: [tensor("y", "FP32", [...x.shape], y), tensor("n", "INT32", [x.shape[0]!, 1], n)] };
      } finally {
        running -= 1;
      }
    },
  });
  return {
    batcher,
    recorder,
    executions,
    sizes: () => executions.map((e) => e.sizes.reduce((a, b) => a + b, 0)),
    get maxRunning() {
      return maxRunning;
    },
    hold() {
      gate = new Promise((r) => {
        open = r;
      });
    },
    release() {
      gate = undefined;
      open?.();
    },
    infer: (r: InferRequest, o?: InferOptions) => batcher.infer(r, o),
  };
}

/** Lets queued microtasks and zero-delay work run. */
const settle = () => sleep(5);

function expectDoubled(request: InferRequest, response: InferResponse) {
  const x = request.inputs[0]!;
  const y = response.outputs.find((t) => t.name === "y")!;
  expect(y.shape).toEqual(x.shape);
  expect(Array.from(y.data as Float32Array)).toEqual(Array.from(x.data as Float32Array, (v) => v * 2));
}

describe("createDynamicBatcher", () => {
  it("concatenates requests of sizes 1..4 and splits outputs back exactly", async () => {
    const h = harness(16, {});
    h.hold();
    const blocker = h.infer(req(1, 9));
    await settle();
    const requests = [1, 2, 3, 4].map((n) => req(n, n, 2, `r${n}`));
    const pending = requests.map((r) => h.infer(r));
    await settle();
    h.release();
    const responses = await Promise.all(pending);
    await blocker;
    expect(h.sizes()).toEqual([1, 10]);
    expect(h.executions[1]!.ids).toEqual(["r1", "r2", "r3", "r4"]);
    responses.forEach((res, i) => {
      expect(res.id).toBe(`r${i + 1}`);
      expect(res.modelName).toBe("toy");
      expectDoubled(requests[i]!, res);
      const n = res.outputs.find((t) => t.name === "n")!;
      expect(n.shape).toEqual([i + 1, 1]);
      expect(Array.from(n.data as Int32Array)).toEqual(new Array(i + 1).fill(10));
    });
    const stats = h.recorder.snapshot();
    expect(stats.executionCount).toBe(2n);
    expect(stats.inferenceCount).toBe(11n);
    expect(stats.inferenceStats?.success?.count).toBe(5n);
    expect(stats.inferenceStats?.queue?.count).toBe(5n);
    expect(stats.batchStats.map((b) => [b.batchSize, b.computeInfer?.count])).toEqual([
      [1n, 1n],
      [10n, 1n],
    ]);
  });

  it("returns only the outputs each request asked for", async () => {
    const h = harness(8, {});
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const a = h.infer({ ...req(2, 1), outputs: [{ name: "n" }] });
    const b = h.infer(req(1, 2));
    await settle();
    h.release();
    const [ra, rb] = await Promise.all([a, b]);
    await blocker;
    expect(ra.outputs.map((t) => t.name)).toEqual(["n"]);
    expect(rb.outputs.map((t) => t.name)).toEqual(["y", "n"]);
  });

  it("never exceeds max_batch_size and keeps incompatible requests in separate executions", async () => {
    const h = harness(4, {});
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const reqs = [req(3, 1), req(2, 2), req(2, 3), req(1, 4, 5), req(1, 5, 5), req(2, 6)];
    const pending = reqs.map((r) => h.infer(r));
    await settle();
    h.release();
    const res = await Promise.all(pending);
    await blocker;
    for (const [i, r] of res.entries()) expectDoubled(reqs[i]!, r);
    // 3 (2 would overflow) | 2+2 | width-5 pair | 2
    expect(h.executions.slice(1).map((e) => e.sizes)).toEqual([[3], [2, 2], [1, 1], [2]]);
    expect(Math.max(...h.sizes())).toBeLessThanOrEqual(4);
  });

  it("rejects a request larger than max_batch_size with INVALID_ARGUMENT", async () => {
    const h = harness(4, {});
    const err = await rejectionOf(h.infer(req(5, 1)), StageError);
    expect(err.code).toBe(Code.InvalidArgument);
    // Triton's words (core src/infer_request.cc, Normalize).
    expect(err.message).toMatch(/inference request batch-size must be <= 4 for '\w+' \(got 5\)/);
    const mixed = await rejectionOf(
      h.infer({ inputs: [req(2, 1).inputs[0]!, { ...req(3, 1).inputs[0]!, name: "x" }] }),
      StageError,
    );
    expect(mixed.code).toBe(Code.InvalidArgument);
    expect(h.executions).toHaveLength(0);
  });

  it("sends the largest preferred batch size at once and waits for the queue delay otherwise", async () => {
    const h = harness(8, { preferredBatchSize: [4], maxQueueDelayMicroseconds: 30_000n });
    h.hold();
    const blocker = h.infer(req(4, 0)); // preferred size: runs without waiting
    await settle();
    expect(h.sizes()).toEqual([4]);
    const six = Array.from({ length: 6 }, (_, i) => h.infer(req(1, i + 1)));
    await settle();
    h.release();
    await Promise.all([blocker, ...six]);
    // 4 (preferred) at once, then the 2 left over together once the delay expired.
    expect(h.sizes()).toEqual([4, 4, 2]);
  });

  it("eager: an idle instance runs what is queued at once; batches form while it is busy", async () => {
    const h = harness(8, { preferredBatchSize: [4], maxQueueDelayMicroseconds: 60_000_000n }, { strategy: "eager" });
    h.hold();
    const first = h.infer(req(1, 0)); // idle: runs at once despite the minute-long delay
    await settle();
    expect(h.sizes()).toEqual([1]);
    const busy = [1, 2, 3].map((i) => h.infer(req(1, i)));
    await settle();
    expect(h.batcher.queued).toBe(3); // the only instance is busy: they wait and merge
    h.release();
    await Promise.all([first, ...busy]);
    expect(h.sizes()).toEqual([1, 3]);
  });

  it("holds a batch below the preferred size until the delay expires", async () => {
    const h = harness(8, { preferredBatchSize: [4], maxQueueDelayMicroseconds: 60_000_000n });
    const first = [1, 2, 3].map((i) => h.infer(req(1, i)));
    await settle();
    expect(h.executions).toHaveLength(0);
    expect(h.batcher.queued).toBe(3);
    const last = h.infer(req(1, 4));
    await Promise.all([...first, last]);
    expect(h.sizes()).toEqual([4]);
  });

  it("without dynamic_batching runs each request alone", async () => {
    const h = harness(8);
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const pending = [req(2, 1), req(1, 2), req(3, 3)].map((r) => h.infer(r));
    await settle();
    h.release();
    await Promise.all([blocker, ...pending]);
    expect(h.executions.map((e) => e.sizes)).toEqual([[1], [2], [1], [3]]);
  });

  it("runs up to `instances` executions at once", async () => {
    const h = harness(1, {}, { instances: 2 });
    h.hold();
    const pending = [1, 2, 3].map((i) => h.infer(req(1, i)));
    await settle();
    expect(h.executions).toHaveLength(2);
    expect(h.batcher.executing).toBe(2);
    expect(h.batcher.queued).toBe(1);
    expect(new Set(h.executions.map((e) => e.instance))).toEqual(new Set([0, 1]));
    h.release();
    await Promise.all(pending);
    expect(h.maxRunning).toBe(2);
  });

  it("reports each level's queue for the runtime's admission (max_queue_size, requests queued)", async () => {
    const h = harness(1, { defaultQueuePolicy: create(ModelQueuePolicySchema, { maxQueueSize: 2 }) });
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const queued = [h.infer(req(1, 1)), h.infer(req(1, 2))];
    await settle();
    expect(h.batcher.queueLevel()).toEqual({ number: 1, maxQueueSize: 2, queued: 2 });
    h.release();
    await Promise.all([blocker, ...queued]);
    expect(h.batcher.queueLevel().queued).toBe(0);
  });

  it("REJECT: a request past its timeout fails with its reason while the others succeed", async () => {
    const h = harness(1, {
      defaultQueuePolicy: create(ModelQueuePolicySchema, { allowTimeoutOverride: true }),
    });
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const late = h.infer(req(1, 1), { timeoutMicroseconds: 2_000 });
    const patient = h.infer(req(1, 2));
    const err = await rejectionOf(late, StageError);
    expect(err.code).toBe(Code.Unavailable);
    expect(err.message).toMatch(/Request timeout expired.*2000 µs/);
    h.release();
    expectDoubled(req(1, 2), await patient);
    await blocker;
    expect(h.executions).toHaveLength(2);
  });

  it("takes a timeout longer than a Node timer holds (over 24.8 days) as none, not as an immediate one", async () => {
    const h = harness(1, {
      defaultQueuePolicy: create(ModelQueuePolicySchema, { allowTimeoutOverride: true }),
    });
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const patient = h.infer(req(1, 1), { timeoutMicroseconds: 3_000_000_000_000 });
    await new Promise((r) => setTimeout(r, 20));
    h.release();
    expectDoubled(req(1, 1), await patient);
    await blocker;
  });

  it("ignores a per-request timeout unless allow_timeout_override is set, and applies the default", async () => {
    const h = harness(1, {
      defaultQueuePolicy: create(ModelQueuePolicySchema, { defaultTimeoutMicroseconds: 3_000n }),
    });
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    // The override (1 hour) is not allowed, so the default 3 ms applies.
    const err = await rejectionOf(h.infer(req(1, 1), { timeoutMicroseconds: 3_600_000_000 }), StageError);
    expect(err.message).toMatch(/3000 µs/);
    h.release();
    await blocker;
  });

  it("DELAY: a timed-out request is served after the requests still within their timeout", async () => {
    const h = harness(1, {
      defaultQueuePolicy: create(ModelQueuePolicySchema, {
        timeoutAction: ModelQueuePolicy_TimeoutAction.DELAY,
        allowTimeoutOverride: true,
      }),
    });
    h.hold();
    const blocker = h.infer(req(1, 0, 2, "blocker"));
    await settle();
    const delayed = h.infer(req(1, 1, 2, "delayed"), { timeoutMicroseconds: 1_000 });
    await sleep(20); // its 1 ms timer fires first
    const fresh = h.infer(req(1, 2, 2, "fresh"));
    await settle();
    h.release();
    await Promise.all([blocker, delayed, fresh]);
    expect(h.executions.map((e) => e.ids[0])).toEqual(["blocker", "fresh", "delayed"]);
  });

  it("serves priority level 1 before lower levels, with the default level for unset priority", async () => {
    const h = harness(1, { priorityLevels: 2n, defaultPriorityLevel: 2n });
    h.hold();
    const blocker = h.infer(req(1, 0, 2, "blocker"));
    await settle();
    const pending = [
      h.infer(req(1, 1, 2, "low-a")),
      h.infer(req(1, 2, 2, "low-b"), { priority: 2 }),
      h.infer(req(1, 3, 2, "high"), { priority: 1 }),
      h.infer(req(1, 4, 2, "out-of-range"), { priority: 7 }),
    ];
    await settle();
    h.release();
    await Promise.all([blocker, ...pending]);
    expect(h.executions.map((e) => e.ids[0])).toEqual(["blocker", "high", "low-a", "low-b", "out-of-range"]);
  });

  it("queues each priority level apart, with its own queue policy", async () => {
    const h = harness(1, {
      priorityLevels: 2n,
      defaultPriorityLevel: 2n,
      priorityQueuePolicy: { "1": create(ModelQueuePolicySchema, { maxQueueSize: 1 }) },
    });
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const ok = h.infer(req(1, 1), { priority: 1 });
    const low = [h.infer(req(1, 3)), h.infer(req(1, 4))];
    await settle();
    expect(h.batcher.queueLevel(1)).toEqual({ number: 1, maxQueueSize: 1, queued: 1 });
    // Priority 0 and out-of-range priorities go to default_priority_level (2), unbounded.
    expect(h.batcher.queueLevel(0)).toEqual({ number: 2, maxQueueSize: 0, queued: 2 });
    expect(h.batcher.queueLevel(7)).toEqual({ number: 2, maxQueueSize: 0, queued: 2 });
    h.release();
    await Promise.all([blocker, ok, ...low]);
  });

  it("removes a request cancelled while queued", async () => {
    const h = harness(1, {});
    h.hold();
    const blocker = h.infer(req(1, 0, 2, "blocker"));
    await settle();
    const ac = new AbortController();
    const cancelled = h.infer(req(1, 1, 2, "cancelled"), { signal: ac.signal });
    const kept = h.infer(req(1, 2, 2, "kept"));
    await settle();
    expect(h.batcher.queued).toBe(2);
    ac.abort();
    const err = await rejectionOf(cancelled, StageError);
    expect(err.code).toBe(Code.Canceled);
    expect(h.batcher.queued).toBe(1);
    h.release();
    await Promise.all([blocker, kept]);
    expect(h.executions.map((e) => e.ids[0])).toEqual(["blocker", "kept"]);
    // An already-aborted signal never enters the queue.
    const err2 = await rejectionOf(h.infer(req(1, 3), { signal: AbortSignal.abort() }), StageError);
    expect(err2.code).toBe(Code.Canceled);
  });

  it("rejects a bad request alone; a failing execution fails only its own requests", async () => {
    const h = harness(8, {});
    h.hold();
    const blocker = h.infer(req(1, 0));
    await settle();
    const good = [req(1, 1), req(2, 2)];
    const bad: InferRequest = { inputs: [{ ...req(1, 3).inputs[0]!, name: "nope" } as Tensor] };
    const wide = req(1, 4, 3); // width 3: its execution throws
    const goodPending = good.map((r) => h.infer(r));
    const badErr = rejectionOf(h.infer(bad), StageError);
    const wideErr = rejectionOf(h.infer(wide), StageError);
    const more = req(1, 5);
    const morePending = h.infer(more);
    await settle();
    h.release();
    expect((await badErr).code).toBe(Code.InvalidArgument);
    expect((await badErr).message).toMatch(/unknown input nope/);
    expect((await wideErr).message).toMatch(/executor refuses width 3/);
    const res = await Promise.all(goodPending);
    for (const [i, r] of res.entries()) expectDoubled(good[i]!, r);
    expectDoubled(more, await morePending);
    await blocker;
    expect(h.executions.slice(1).map((e) => e.sizes)).toEqual([[1, 2], [1], [1]]);
  });

  it("close() fails queued requests with UNAVAILABLE and finishes executions in flight", async () => {
    const h = harness(1, {});
    h.hold();
    const running = h.infer(req(1, 0));
    await settle();
    const queued = rejectionOf(h.infer(req(1, 1)), StageError);
    const closing = h.batcher.close();
    expect((await queued).code).toBe(Code.Unavailable);
    h.release();
    await closing;
    await running;
    expect((await rejectionOf(h.infer(req(1, 2)), StageError)).code).toBe(Code.Unavailable);
  });
});

describe("createDynamicBatcher with admit (a CpuGate held during runs)", () => {
  it("forms the batch once admitted, so requests that arrive meanwhile join it, and releases when the run ends", async () => {
    const gate = new CpuGate();
    const decode = await gate.acquireShared();
    let releasedAfterRun = false;
    const h = harness(
      8,
      {},
      {
        strategy: "eager",
        admit: async () => {
          const release = await gate.acquireExclusive();
          return () => {
            releasedAfterRun = h.executions.length > 0;
            release();
          };
        },
      },
    );
    const first = h.infer(req(1, 1));
    await settle();
    // The batcher waits for the shared holder (a decode in flight) before forming a batch.
    expect(h.executions).toHaveLength(0);
    const second = h.infer(req(2, 2));
    await settle();
    decode();
    await Promise.all([first, second]);
    expect(h.sizes()).toEqual([3]);
    expect(releasedAfterRun).toBe(true);
    expect(gate.heldExclusively).toBe(false);
  });

  it("lets shared holders in between runs", async () => {
    const gate = new CpuGate();
    const order: string[] = [];
    const h = harness(8, {}, { strategy: "eager", admit: () => gate.acquireExclusive() });
    h.hold();
    const first = h.infer(req(1, 1)).then(() => order.push("run 1"));
    await settle();
    const decode = gate.withShared(async () => {
      order.push("decode");
    });
    const second = h.infer(req(1, 2)).then(() => order.push("run 2"));
    await settle();
    h.release();
    await Promise.all([first, decode, second]);
    expect(order).toEqual(["run 1", "decode", "run 2"]);
  });
});
