/** createPipeline: stages one holds, chained by position or mapped by name, as an ordinary Stage. */
import { parseModelConfig } from "@trellis/protocol";
import { Code, defineStage, type Stage, StageError, tensor } from "@trellis/stage";
import { describe, expect, it } from "vitest";
import { createPipeline } from "../src/index.js";

const scale = (name: string, by: number, maxBatch = 8): Stage =>
  defineStage({
    config: parseModelConfig(`name: "${name}" max_batch_size: ${maxBatch}
      input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ] output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]`),
    compute: (r) => [{ ...r.inputs[0]!, name: "OUT", data: (r.inputs[0]!.data as Float32Array).map((v) => v * by) }],
  });

/** Two outputs: the sum and the difference of its two inputs. */
const sumDiff = defineStage({
  config: parseModelConfig(`name: "sum_diff" max_batch_size: 8
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 2 ] } ]`),
  compute: (r) => {
    const [a, b] = r.inputs.map((t) => t.data as Float32Array) as [Float32Array, Float32Array];
    return [
      { ...r.inputs[0]!, name: "SUM", data: a.map((v, i) => v + b[i]!) },
      { ...r.inputs[0]!, name: "DIFF", data: a.map((v, i) => v - b[i]!) },
    ];
  },
});

const x = (values: number[], batch = 1) => tensor("IN", "FP32", [batch, 2], Float32Array.from(values));

describe("createPipeline", () => {
  it("chains one-input, one-output stages in order; its tensors and batch bound come from them", async () => {
    const p = await createPipeline([scale("double", 2, 8), scale("triple", 3, 4)], { name: "chain" });
    const meta = await p.metadata();
    expect(meta).toMatchObject({ name: "chain", inputs: [{ name: "IN", shape: [-1, 2] }], outputs: [{ name: "OUT" }] });
    expect(p.config.maxBatchSize).toBe(4);
    const res = await p.infer({ inputs: [x([1, 2, 3, 4], 2)] });
    expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual([6, 12, 18, 24]);
    // A request over the smallest step's batch is refused by the pipeline, naming it.
    const err = await p.infer({ inputs: [x(Array(10).fill(1), 5)] }).catch((e) => e);
    expect(err).toBeInstanceOf(StageError);
    expect((err as StageError).code).toBe(Code.InvalidArgument);
    expect((err as StageError).message).toContain("chain");
    await p.close();
  });

  it("maps several inputs and outputs by name, and says which step needs a mapping", async () => {
    const p = await createPipeline([
      { stage: sumDiff, inputs: { A: "X", B: "Y" }, outputs: { SUM: "s", DIFF: "d" } },
      { stage: scale("double", 2), inputs: { IN: "s" }, outputs: { OUT: "doubled_sum" } },
    ]);
    const meta = await p.metadata();
    expect(meta.inputs.map((t) => t.name)).toEqual(["X", "Y"]);
    expect(meta.outputs.map((t) => t.name)).toEqual(["doubled_sum"]);
    const res = await p.infer({
      inputs: [tensor("X", "FP32", [1, 2], Float32Array.of(5, 7)), tensor("Y", "FP32", [1, 2], Float32Array.of(1, 2))],
    });
    expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual([12, 18]);
    await p.close();

    const unmapped = await createPipeline([sumDiff, scale("double", 2)]).catch((e) => e);
    expect(unmapped).toBeInstanceOf(StageError);
    expect((unmapped as StageError).message).toMatch(
      /step 0 \(sum_diff inputs\) has 2 tensors \[A, B\]: map them by name/,
    );
    const wrongName = await createPipeline([{ stage: scale("double", 2), inputs: { NOPE: "X" } }]).catch((e) => e);
    expect((wrongName as StageError).message).toContain("step 0 (double) has no input NOPE");
  });

  it("refuses two different stages under one name, and an empty list", async () => {
    const clash = await createPipeline([scale("same", 2), scale("same", 3)]).catch((e) => e);
    expect((clash as StageError).code).toBe(Code.InvalidArgument);
    expect((clash as StageError).message).toContain("both named same");
    const empty = await createPipeline([]).catch((e) => e);
    expect((empty as StageError).message).toContain("at least one step");
  });

  it("can be a step of another pipeline", async () => {
    const inner = await createPipeline([scale("double", 2), scale("triple", 3)], { name: "inner" });
    const outer = await createPipeline([inner, scale("negate", -1)], { name: "outer" });
    const res = await outer.infer({ inputs: [x([1, 2])] });
    expect(Array.from(res.outputs[0]!.data as Float32Array)).toEqual([-6, -12]);
    await outer.close();
  });
});
