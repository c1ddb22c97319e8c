import { parseModelConfig } from "@trellis/protocol";
import { Code, defineStage, type InferRequest, StageError, tensor } from "@trellis/stage";
import { observeRequests } from "@trellis/stage/backend";
import { rejectionOf } from "@trellis/testing";
import { describe, expect, it } from "vitest";
import {
  createModel,
  createModelRuntime,
  instanceCount,
  type ModelBackend,
  stageBackend,
} from "../src/model-runtime.js";
import { RateLimiter } from "../src/rate-limiter.js";

const config = (extra = "") =>
  parseModelConfig(`name: "m" backend: "typescript" max_batch_size: 4
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
    ${extra}`);

/** OUT = IN * 2; every call's batch size is kept in `calls`. */
function doubler(extra = "") {
  const calls: number[] = [];
  const stage = defineStage({
    config: config(extra),
    async compute(request: InferRequest) {
      const input = request.inputs[0]!;
      calls.push(input.shape[0]!);
      await new Promise((r) => setTimeout(r, 5));
      return [
        tensor(
          "OUT",
          "FP32",
          input.shape,
          (input.data as Float32Array).map((v) => v * 2),
        ),
      ];
    },
  });
  return { stage, calls };
}

const request = (...values: number[]): InferRequest => ({
  inputs: [tensor("IN", "FP32", [values.length / 2, 2], Float32Array.from(values))],
});

describe("createModelRuntime", () => {
  it("runs concurrent requests as merged batches on one instance and splits the answers back", async () => {
    const { stage, calls } = doubler("dynamic_batching { }");
    const runtime = await createModelRuntime({ config: stage.config, backend: stageBackend(stage, 1) });
    const answers = await Promise.all([request(1, 2), request(3, 4), request(5, 6, 7, 8)].map((r) => runtime.infer(r)));
    expect(answers.map((a) => Array.from(a.outputs[0]!.data as Float32Array))).toEqual([
      [2, 4],
      [6, 8],
      [10, 12, 14, 16],
    ]);
    // The first runs alone at once; the two that queued behind it merge into one call.
    expect(calls).toEqual([1, 3]);
    const stats = (await runtime.statistics()).inferenceStats!;
    expect([stats.success!.count, (await runtime.statistics()).executionCount]).toEqual([3n, 2n]);
    await runtime.close();
  });

  it("refuses a bad request with Triton's words before the backend runs", async () => {
    const { stage, calls } = doubler();
    const runtime = await createModelRuntime({ config: stage.config, backend: stageBackend(stage, 1) });
    const err = await rejectionOf(
      runtime.infer({ inputs: [tensor("IN", "FP32", [1, 3], Float32Array.of(1, 2, 3))] }),
      StageError,
    );
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("unexpected shape for input 'IN' for model 'm'. Expected [-1,2], got [1,3]");
    expect(calls).toEqual([]);
    expect((await runtime.statistics()).inferenceStats!.fail!.count).toBe(1n);
    await runtime.close();
  });

  it("records a wrapped defineStage's requests once, for the observers too", async () => {
    const { stage } = doubler();
    const runtime = await createModelRuntime({ config: stage.config, backend: stageBackend(stage, 2) });
    const heard: string[] = [];
    const stop = observeRequests((s) => heard.push(s.model));
    try {
      await runtime.infer(request(1, 2));
    } finally {
      stop();
    }
    expect(heard).toEqual(["m"]);
    expect((await stage.statistics()).inferenceCount).toBe(0n);
    expect((await runtime.statistics()).inferenceCount).toBe(1n);
    await runtime.close();
    expect(await stage.isReady()).toBe(false);
  });

  it("admits a TypeScript stage's instances through the rate limiter, across models", async () => {
    const limiter = new RateLimiter({ R: 1 });
    let running = 0;
    let peak = 0;
    const limited = async () => {
      const stage = defineStage({
        config: config('instance_group [ { count: 2 rate_limiter { resources [ { name: "R" count: 1 } ] } } ]'),
        async compute(request: InferRequest) {
          peak = Math.max(peak, ++running);
          await new Promise((r) => setTimeout(r, 10));
          running--;
          return [tensor("OUT", "FP32", request.inputs[0]!.shape, request.inputs[0]!.data as Float32Array)];
        },
      });
      return createModelRuntime({
        config: stage.config,
        backend: stageBackend(stage, instanceCount(stage.config)),
        rateLimiter: limiter,
      });
    };
    const [a, b] = [await limited(), await limited()];
    expect(instanceCount(a.config)).toBe(2);
    await Promise.all([a, b, a, b].map((m, i) => m.infer(request(i, i))));
    // Four instances in all, but one unit of R: one execution at a time.
    expect(peak).toBe(1);
    await Promise.all([a.close(), b.close()]);
  });

  it("counts a reservation (a request whose body is still arriving) for draining, not in flight", async () => {
    const { stage } = doubler();
    const model = await createModel({ config: stage.config, backend: stageBackend(stage, 1) });
    const release = model.reserve();
    expect(model.inflight).toBe(0);
    const during = model.infer(request(1, 2));
    expect(model.inflight).toBe(1);
    await during;
    expect(model.inflight).toBe(0);
    let drained = false;
    const draining = model.drained().then(() => {
      drained = true;
    });
    await new Promise((r) => setTimeout(r, 20));
    expect(drained).toBe(false);
    release();
    release(); // a second release does nothing
    await draining;
    expect(drained).toBe(true);
    await model.close();
  });

  it("runs a backend that bounds its own work directly: at once, checked, counted, and drained at close", async () => {
    // An ensemble's or a remote model's shape: instances unbounded, no dynamic_batching.
    let inside = 0;
    let most = 0;
    let open!: () => void;
    const gate = new Promise<void>((r) => {
      open = r;
    });
    const backend: ModelBackend = {
      instances: Number.POSITIVE_INFINITY,
      async computeBatch(batch) {
        inside++;
        most = Math.max(most, inside);
        await gate;
        inside--;
        if ((batch.inputs[0]!.data as Float32Array)[0] === -1) throw new Error("the backend failed");
        return { outputs: [tensor("OUT", "FP32", batch.inputs[0]!.shape, batch.inputs[0]!.data as Float32Array)] };
      },
      close: async () => {},
    };
    const model = await createModel({ config: config(), backend });
    const good = [request(1, 2), request(3, 4, 5, 6), request(7, 8)].map((r) => model.infer(r));
    const failing = model.infer(request(-1, 0));
    const bad = await rejectionOf(
      model.infer({ inputs: [tensor("IN", "INT32", [1, 2], Int32Array.of(1, 2))] }),
      StageError,
    );
    const cancelled = await rejectionOf(model.infer(request(1, 1), { signal: AbortSignal.abort() }), StageError);
    await new Promise((r) => setTimeout(r, 10));
    // All four ran at once, none queued: nothing waits in a queue the server could see.
    expect([most, model.pendingRequests?.() ?? 0]).toEqual([4, 0]);
    expect([bad.code, cancelled.code]).toEqual([Code.InvalidArgument, Code.Canceled]);
    const closing = model.close();
    open();
    const answers = await Promise.all(good);
    expect(answers.map((a) => Array.from(a.outputs[0]!.data as Float32Array))).toEqual([
      [1, 2],
      [3, 4, 5, 6],
      [7, 8],
    ]);
    expect((await rejectionOf(failing, StageError)).rawMessage).toMatch(/the backend failed/);
    await closing;
    const stats = model.statistics();
    expect([stats.inferenceStats!.success!.count, stats.inferenceStats!.fail!.count]).toEqual([3n, 3n]);
    expect([stats.executionCount, stats.inferenceCount]).toEqual([3n, 4n]);
    await expect(model.infer(request(1, 2))).rejects.toThrow(/unloading/);
  });
});
