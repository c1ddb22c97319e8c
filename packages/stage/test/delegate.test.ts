import { parseModelConfig } from "@trellis/protocol";
import { describe, expect, it } from "vitest";
import { defineStage } from "../src/define.js";
import { delegateStage } from "../src/delegate.js";
import type { InferRequest, InferResponse, Stage } from "../src/stage.js";
import { tensor } from "../src/tensor.js";

const coupled = parseModelConfig(`name: "one" backend: "typescript" max_batch_size: 0
  input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
  output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]`);
const decoupled = parseModelConfig(`name: "many" backend: "typescript" max_batch_size: 0
  input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
  output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
  model_transaction_policy { decoupled: true }`);

const request = (n: number): InferRequest => ({ id: `r${n}`, inputs: [tensor("IN", "INT32", [1], Int32Array.of(n))] });
const value = (r: InferResponse) => r.outputs[0]!.data[0];

/** A stage answering n * factor. */
const times = (factor: number) =>
  defineStage({
    config: coupled,
    compute: (r) => [tensor("OUT", "INT32", [1], Int32Array.of(Number(r.inputs[0]!.data[0]) * factor))],
  });

/** A decoupled stage counting down from n. */
const countdown = () =>
  defineStage({
    config: decoupled,
    async *computeStream(r) {
      for (let i = Number(r.inputs[0]!.data[0]); i >= 1; i--) yield [tensor("OUT", "INT32", [1], Int32Array.of(i))];
    },
  });

/** A stage with a queue of its own, written as a class (its methods need `this`). */
class Queued implements Stage {
  readonly name = "queued";
  readonly version = "1";
  readonly config = coupled;
  #waiting = 3;
  closed = 0;
  isReady() {
    return true;
  }
  metadata() {
    return times(1).metadata();
  }
  async infer(r: InferRequest) {
    return times(1).infer(r);
  }
  statistics() {
    return times(1).statistics();
  }
  pendingRequests() {
    return this.#waiting;
  }
  maxQueueSize() {
    return this.#waiting * 10;
  }
  async close() {
    this.closed++;
  }
}

const OPTIONAL = ["inferStream", "pendingRequests", "maxQueueSize"] as const;

describe("delegateStage", () => {
  it("keeps each optional method the inner stage has, calling it as the inner stage's", async () => {
    const inner = new Queued();
    const wrapped = delegateStage(inner);
    expect(wrapped.pendingRequests?.()).toBe(3);
    expect(wrapped.maxQueueSize?.()).toBe(30);
    expect("inferStream" in wrapped).toBe(false);
    expect(value(await wrapped.infer(request(4)))).toBe(4);
    await wrapped.close();
    expect(inner.closed).toBe(1);
    expect([wrapped.name, wrapped.version, wrapped.config]).toEqual([inner.name, inner.version, inner.config]);

    const stream = delegateStage(countdown());
    expect(typeof stream.inferStream).toBe("function");
    const values: unknown[] = [];
    for await (const r of stream.inferStream!(request(3))) values.push(value(r));
    expect(values).toEqual([3, 2, 1]);
  });

  it("has no optional method the inner stage lacks, so presence checks stay truthful", () => {
    const wrapped = delegateStage(times(2));
    for (const key of OPTIONAL) {
      expect(key in wrapped, key).toBe(false);
      expect(wrapped[key], key).toBeUndefined();
    }
    const stream = delegateStage(countdown());
    expect(["inferStream" in stream, "pendingRequests" in stream, "maxQueueSize" in stream]).toEqual([
      true,
      false,
      false,
    ]);
  });

  it("passes on every member of a stage that has them all", () => {
    const all: Stage = Object.assign(new Queued(), {
      inferStream: (r: InferRequest) => countdown().inferStream!(r),
    });
    const wrapped = delegateStage(all);
    expect(Object.keys(wrapped).sort()).toEqual(
      [
        "name",
        "version",
        "config",
        "isReady",
        "metadata",
        "infer",
        "inferStream",
        "statistics",
        "pendingRequests",
        "maxQueueSize",
        "close",
      ].sort(),
    );
  });

  it("uses the overrides given, getters included, and removes a member overridden with undefined", async () => {
    const inner = new Queued();
    let version = "7";
    const wrapped = delegateStage(inner, {
      infer: async (r) => times(10).infer(r),
      pendingRequests: undefined,
      get version() {
        return version;
      },
    });
    expect(value(await wrapped.infer(request(2)))).toBe(20);
    expect("pendingRequests" in wrapped).toBe(false);
    expect(wrapped.maxQueueSize?.()).toBe(30);
    expect(wrapped.version).toBe("7");
    version = "8";
    expect(wrapped.version).toBe("8");
  });

  it("given a function, calls whichever stage it returns at the moment", async () => {
    let current: Stage = times(2);
    const wrapped = delegateStage(() => current);
    expect(value(await wrapped.infer(request(3)))).toBe(6);
    current = times(5);
    expect(value(await wrapped.infer(request(3)))).toBe(15);
  });
});
