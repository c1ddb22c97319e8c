import { parseModelConfig } from "@trellis/protocol";
import type { InferOptions, RequestTrace, Stage } from "@trellis/stage";
import { Code, defineStage, StageError, tensor } from "@trellis/stage";
import { rejectionOf } from "@trellis/testing";
import { describe, expect, it } from "vitest";
import { createModelCaller } from "../src/model-caller.js";

const config = (name: string, extra = "") =>
  parseModelConfig(`name: "${name}" max_batch_size: 0
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ] ${extra}`);

const seen: InferOptions[] = [];
/** Y = X * factor; version "2" of "scale" multiplies by 20. */
const scale = (version: string, factor: number) =>
  defineStage({
    config: config("scale"),
    version,
    compute(request, options) {
      seen.push(options ?? {});
      return [tensor("Y", "INT32", [1], Int32Array.of((request.inputs[0]!.data as Int32Array)[0]! * factor))];
    },
  });
const countdown = defineStage({
  config: config("countdown", "model_transaction_policy { decoupled: true }"),
  async *computeStream(request) {
    for (let i = (request.inputs[0]!.data as Int32Array)[0]!; i >= 1; i--)
      yield [tensor("Y", "INT32", [1], Int32Array.of(i))];
  },
});

const stages: Record<string, Stage> = { "scale@1": scale("1", 2), "scale@2": scale("2", 20), "countdown@1": countdown };
const caller = createModelCaller((model, version) => {
  const stage = stages[`${model}@${version ?? (model === "scale" ? "2" : "1")}`];
  if (!stage) throw new StageError(Code.NotFound, "", `Request for unknown model: '${model}' is not found`);
  return stage;
});
const x = (n: number) => ({ inputs: [tensor("X", "INT32", [1], Int32Array.of(n))] });
const y = (r: { outputs: { data: unknown }[] }) => (r.outputs[0]!.data as Int32Array)[0];

describe("createModelCaller", () => {
  it("runs the model asked for, its latest version or the one named", async () => {
    expect(y(await caller.infer("scale", x(3)))).toBe(60);
    expect(y(await caller.infer("scale", x(3), { version: "1" }))).toBe(6);
    expect([await caller.isReady("scale"), await caller.isReady("scale", "7"), await caller.isReady("absent")]).toEqual(
      [true, false, false],
    );
    const missing = await rejectionOf(caller.infer("absent", x(1)), StageError);
    expect([missing.code, missing.rawMessage]).toEqual([
      Code.NotFound,
      "Request for unknown model: 'absent' is not found",
    ]);
  });

  it("streams a decoupled model's responses; its one-answer call refuses", async () => {
    const answers = [];
    for await (const r of caller.inferStream("countdown", x(3))) answers.push(y(r));
    expect(answers).toEqual([3, 2, 1]);
    const oneAnswer = [];
    for await (const r of caller.inferStream("scale", x(1))) oneAnswer.push(y(r));
    expect(oneAnswer).toEqual([20]);
    expect((await rejectionOf(caller.infer("countdown", x(3)), StageError)).code).toBe(Code.Unimplemented);
  });

  it("hands the called model the caller's signal, and a child of its trace", async () => {
    const children: string[] = [];
    const child: RequestTrace = { stamp: () => {}, tensor: () => {}, child: () => child, end: () => {} };
    const trace: RequestTrace = {
      ...child,
      child(model, version) {
        children.push(`${model}@${version}`);
        return child;
      },
    };
    const signal = new AbortController().signal;
    seen.length = 0;
    await caller.infer("scale", x(1), { trace, signal, version: "1" });
    expect(children).toEqual(["scale@1"]);
    expect(seen[0]!.trace).toBe(child);
    expect(seen[0]!.signal).toBe(signal);
    expect(seen[0]).not.toHaveProperty("version");
  });
});
