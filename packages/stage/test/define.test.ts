import { ConnectError } from "@connectrpc/connect";
import { parseModelConfig } from "@trellis/protocol";
import { rejectionOf } from "@trellis/testing";
import { describe, expect, it } from "vitest";
import { defineStage } from "../src/define.js";
import { Code, StageError } from "../src/errors.js";
import type { InferResponse } from "../src/stage.js";
import { type Tensor, tensor } from "../src/tensor.js";

const config = parseModelConfig(`name: "double" backend: "typescript" max_batch_size: 8
  input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]
  output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] } ]`);

const double = (x: Tensor) => Float32Array.from(x.data as Float32Array, (v) => v * 2);

function doubling(extra: { fail?: () => never } = {}) {
  let closes = 0;
  const stage = defineStage({
    config,
    compute(request) {
      const x = request.inputs.find((t) => t.name === "X");
      if (!x) throw new StageError(Code.InvalidArgument, "double", "input X missing");
      extra.fail?.();
      return [tensor("Y", "FP32", x.shape, double(x)), tensor("Z", "FP32", x.shape, new Float32Array(x.data.length))];
    },
    close: () => {
      closes++;
    },
  });
  return { stage, closes: () => closes };
}

describe("defineStage", () => {
  it("serves the config's name, version 1 and metadata, and answers with the computed outputs", async () => {
    const { stage } = doubling();
    expect([stage.name, stage.version, await stage.isReady()]).toEqual(["double", "1", true]);
    const meta = await stage.metadata();
    expect(meta.inputs.map((t) => [t.name, t.datatype, t.shape])).toEqual([["X", "FP32", [-1, 2]]]);
    const res = await stage.infer({ id: "a", inputs: [tensor("X", "FP32", [2, 2], new Float32Array([1, 2, 3, 4]))] });
    expect([res.id, res.modelName, res.modelVersion]).toEqual(["a", "double", "1"]);
    expect(res.outputs.map((t) => t.name)).toEqual(["Y", "Z"]);
    expect(res.outputs[0]?.data).toEqual(new Float32Array([2, 4, 6, 8]));
  });

  it("returns only the requested outputs, and names an unknown one", async () => {
    const { stage } = doubling();
    const x = tensor("X", "FP32", [1, 2], new Float32Array([1, 2]));
    const res = await stage.infer({ inputs: [x], outputs: [{ name: "Z" }] });
    expect(res.outputs.map((t) => t.name)).toEqual(["Z"]);
    const err = await rejectionOf(stage.infer({ inputs: [x], outputs: [{ name: "W" }] }), StageError);
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toBe("double: unknown output W (outputs: Y, Z)");
  });

  it("counts requests, executions by batch size and failures in its statistics", async () => {
    const { stage } = doubling();
    await stage.infer({ inputs: [tensor("X", "FP32", [3, 2], new Float32Array(6))] });
    await stage.infer({ inputs: [tensor("X", "FP32", [1, 2], new Float32Array(2))] });
    await stage.infer({ inputs: [] }).catch(() => undefined);
    const s = await stage.statistics();
    expect(s.inferenceCount).toBe(4n);
    expect(s.executionCount).toBe(2n);
    expect(s.inferenceStats?.success?.count).toBe(2n);
    expect(s.inferenceStats?.fail?.count).toBe(1n);
    expect(s.batchStats.map((b) => b.batchSize).sort()).toEqual([1n, 3n]);
  });

  it("keeps a StageError, keeps a ConnectError's code under the stage's name, and reports anything else as INTERNAL", async () => {
    const x = tensor("X", "FP32", [1, 2], new Float32Array(2));
    const missing = await rejectionOf(doubling().stage.infer({ inputs: [] }), StageError);
    expect([missing.code, missing.rawMessage]).toEqual([Code.InvalidArgument, "double: input X missing"]);
    const remote = doubling({
      fail: () => {
        throw new ConnectError("queue full", Code.ResourceExhausted);
      },
    });
    const exhausted = await rejectionOf(remote.stage.infer({ inputs: [x] }), StageError);
    expect([exhausted.code, exhausted.stage, exhausted.rawMessage]).toEqual([
      Code.ResourceExhausted,
      "double",
      "double: queue full",
    ]);
    const bug = doubling({
      fail: () => {
        throw new TypeError("x is undefined");
      },
    });
    const internal = await rejectionOf(bug.stage.infer({ inputs: [x] }), StageError);
    expect([internal.code, internal.rawMessage]).toEqual([Code.Internal, "double: x is undefined"]);
  });

  it("closes once, then reports not ready and refuses requests with UNAVAILABLE", async () => {
    const { stage, closes } = doubling();
    await Promise.all([stage.close(), stage.close()]);
    expect(closes()).toBe(1);
    expect(await stage.isReady()).toBe(false);
    const err = await rejectionOf(stage.infer({ inputs: [] }), StageError);
    expect(err.code).toBe(Code.Unavailable);
  });

  describe("a decoupled model (computeStream)", () => {
    const decoupled = parseModelConfig(`name: "ticks" backend: "typescript" max_batch_size: 0
      input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
      output [ { name: "T" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "U" data_type: TYPE_INT32 dims: [ 1 ] } ]
      model_transaction_policy { decoupled: true }`);
    const ticks = () =>
      defineStage({
        config: decoupled,
        async *computeStream(request) {
          const n = Number(request.inputs[0]?.data[0] ?? 0);
          for (let i = 1; i <= n; i++) {
            if (n === 99) throw new Error("too many");
            yield [tensor("T", "INT32", [1], Int32Array.of(i)), tensor("U", "INT32", [1], Int32Array.of(-i))];
          }
        },
      });
    const n = (v: number) => ({ id: "r", inputs: [tensor("N", "INT32", [1], Int32Array.of(v))] });
    const collect = async (stream: AsyncIterable<InferResponse>) => {
      const out: InferResponse[] = [];
      for await (const r of stream) out.push(r);
      return out;
    };

    it("sends each yield as a response with the requested outputs, and refuses the one-answer call", async () => {
      const stage = ticks();
      const responses = await collect(stage.inferStream!({ ...n(3), outputs: [{ name: "T" }] }));
      expect(responses.map((r) => [r.id, r.outputs.map((t) => [t.name, (t.data as Int32Array)[0]])])).toEqual([
        ["r", [["T", 1]]],
        ["r", [["T", 2]]],
        ["r", [["T", 3]]],
      ]);
      const once = await rejectionOf(stage.infer(n(1)), StageError);
      expect([once.code, once.rawMessage]).toEqual([
        Code.Unimplemented,
        "ticks: the model is decoupled (model_transaction_policy): it sends its responses over the ModelStreamInfer stream, not one per call",
      ]);
    });

    it("counts one execution and success per request however many responses, and names a failure", async () => {
      const stage = ticks();
      await collect(stage.inferStream!(n(4)));
      await collect(stage.inferStream!(n(0)));
      const failure = await rejectionOf(collect(stage.inferStream!(n(99))), StageError);
      expect([failure.code, failure.rawMessage]).toEqual([Code.Internal, "ticks: too many"]);
      const s = await stage.statistics();
      expect([s.executionCount, s.inferenceStats?.success?.count, s.inferenceStats?.fail?.count]).toEqual([2n, 2n, 1n]);
    });

    it("is defined with computeStream for a decoupled config and compute otherwise, saying which is missing", () => {
      const missingStream = (() => {
        try {
          defineStage({ config: decoupled, compute: () => [] });
        } catch (err) {
          return err as StageError;
        }
      })();
      expect(missingStream?.rawMessage).toBe(
        "ticks: the config is decoupled (model_transaction_policy { decoupled: true }): define computeStream, yielding each response's tensors",
      );
      const missingCompute = (() => {
        try {
          defineStage({ config, async *computeStream() {} });
        } catch (err) {
          return err as StageError;
        }
      })();
      expect(missingCompute?.code).toBe(Code.InvalidArgument);
      expect(missingCompute?.rawMessage).toContain("double: define compute");
      expect(doubling().stage.inferStream).toBeUndefined();
    });
  });
});
