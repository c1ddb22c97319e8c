import { ConnectError } from "@connectrpc/connect";
import { parseModelConfig } from "@trellis/protocol";
import { rejectionOf } from "@trellis/testing";
import { describe, expect, it } from "vitest";
import { defineStage } from "./define.js";
import { Code, StageError } from "./errors.js";
import { type Tensor, tensor } from "./tensor.js";

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
});
