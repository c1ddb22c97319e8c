/**
 * The runtime's admission: one place refuses a request its model's full queue cannot take
 * (UNAVAILABLE, "Exceeds maximum queue size"), before the backend sees it: per priority
 * level (max_queue_size), else the server's default bound, else the backend's own bound.
 */
import { parseModelConfig } from "@trellis/protocol";
import { Code, type InferRequest, StageError, tensor } from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { describe, expect, it } from "vitest";
import { createModelRuntime, type ModelBackend } from "../src/model-runtime.js";

const request = (v: number): InferRequest => ({ inputs: [tensor("IN", "FP32", [1, 2], Float32Array.of(v, v))] });

/** A backend (y = x) whose executions wait for `release`, counting them. */
function heldBackend(instances: number, extra: Partial<ModelBackend> = {}) {
  const seen: number[] = [];
  let open!: () => void;
  const gate = new Promise<void>((r) => {
    open = r;
  });
  const backend: ModelBackend = {
    instances,
    // `execute`, the deprecated name of computeBatch, still works.
    async execute(batch) {
      seen.push((batch.inputs[0]!.data as Float32Array)[0]!);
      await gate;
      return { outputs: [{ ...batch.inputs[0]!, name: "OUT" }] };
    },
    close: async () => {},
    ...extra,
  };
  return { backend, seen, release: () => open() };
}

const config = (extra = "") =>
  parseModelConfig(`name: "m" backend: "typescript" max_batch_size: 4
    input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]
    ${extra}`);

const settle = () => new Promise((r) => setTimeout(r, 5));

describe("the model runtime's admission", () => {
  it("refuses past a level's max_queue_size at once, in Triton's words, counting a failure", async () => {
    const { backend, seen, release } = heldBackend(1);
    const runtime = await createModelRuntime({
      config: config("dynamic_batching { default_queue_policy { max_queue_size: 2 } }"),
      backend,
      defaultMaxQueueSize: 1, // not used: the config sets its own
    });
    const admitted = [runtime.infer(request(1))];
    await settle();
    admitted.push(runtime.infer(request(2)), runtime.infer(request(3)));
    const err = await rejectionOf(runtime.infer(request(4)), StageError);
    expect(err.code).toBe(Code.Unavailable);
    expect(err.rawMessage).toBe(
      "m: Exceeds maximum queue size: 2 requests already queued, the max_queue_size of priority level 1",
    );
    expect(runtime.maxQueueSize()).toBe(2);
    release();
    await Promise.all(admitted);
    expect(seen).not.toContain(4);
    const stats = await runtime.statistics();
    expect([stats.inferenceStats?.success?.count, stats.inferenceStats?.fail?.count]).toEqual([3n, 1n]);
    await runtime.close();
  });

  it("gives a config without max_queue_size the server's default bound, on what it holds pending", async () => {
    // Unbounded instances: nothing queues, so the requests in flight are what it holds.
    const { backend, release } = heldBackend(Number.POSITIVE_INFINITY);
    const runtime = await createModelRuntime({ config: config(), backend, defaultMaxQueueSize: 3 });
    const admitted = [1, 2, 3].map((v) => runtime.infer(request(v)));
    const err = await rejectionOf(runtime.infer(request(4)), StageError);
    expect(err.rawMessage).toBe(
      "m: Exceeds maximum queue size: 3 requests already pending, the server's default bound (--default-max-queue-size) 3",
    );
    release();
    await Promise.all(admitted);
    // Answered, the places are free again.
    await runtime.infer(request(5));
    await runtime.close();
  });

  it("admits no more than a backend's own bound in flight (an ensemble's tightest step)", async () => {
    const { backend, release } = heldBackend(Number.POSITIVE_INFINITY, {
      queueBound: () => ({ bound: 2, what: "the queue bound of step 1 slow (2)" }),
    });
    const runtime = await createModelRuntime({ config: config(), backend });
    const admitted = [runtime.infer(request(1)), runtime.infer(request(2))];
    const err = await rejectionOf(runtime.infer(request(3)), StageError);
    expect(err.rawMessage).toBe(
      "m: Exceeds maximum queue size: 2 requests in flight, the queue bound of step 1 slow (2)",
    );
    expect(runtime.maxQueueSize()).toBe(2);
    release();
    await Promise.all(admitted);
    await runtime.close();
  });
});
