import { Code, StageError, type Tensor, tensor } from "@trellis/stage";
import { describe, expect, it } from "vitest";
import { createEnsemble, type HoldStep } from "../src/index.js";
import { cfg, deferred, fnStage, mapF32, unaryConfig } from "./helpers.js";

const x = (v: number): Tensor => tensor("X", "FP32", [1, 4], new Float32Array(4).fill(v));
const first = (t: Tensor | undefined) => (t?.data as Float32Array | undefined)?.[0];

/** X -> add -> a -> add -> Y: the same model called by two steps. */
const twice = cfg(`
  name: "twice"
  platform: "ensemble"
  max_batch_size: 8
  input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
  output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
  ensemble_scheduling { step [
    { model_name: "add" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "a" } },
    { model_name: "add" model_version: -1 input_map { key: "IN" value: "a" } output_map { key: "OUT" value: "Y" } }
  ] }
`);

describe("each request holds its steps' models once, for its whole run", () => {
  it("a step replaced mid-request: the request finishes on the version it began with, the next runs on the new one", async () => {
    const gate = deferred();
    const v1 = fnStage(
      unaryConfig("add"),
      async ({ IN }) => {
        await gate.promise;
        return [mapF32(IN!, "OUT", (v) => v + 1)];
      },
      "1",
    );
    const v2 = fnStage(unaryConfig("add"), ({ IN }) => [mapF32(IN!, "OUT", (v) => v + 100)], "2");
    let serving = v1;
    const holds: string[] = [];
    let released = 0;
    const holdStep: HoldStep = (model, version) => {
      expect([model, version]).toEqual(["add", -1n]);
      const stage = serving;
      holds.push(stage.version);
      return { stage, release: () => released++ };
    };
    const ensemble = await createEnsemble({ config: twice, resolveStep: () => v1, holdStep });

    const early = ensemble.infer({ inputs: [x(0)] });
    await expect.poll(() => v1.calls.length).toBe(1);
    serving = v2; // the step's model reloaded while `early` is inside its first step
    const late = await ensemble.infer({ inputs: [x(0)] });
    gate.resolve();
    const answer = await early;

    expect(first(answer.outputs[0])).toBe(2); // both steps on version 1, never 101
    expect(first(late.outputs[0])).toBe(200);
    expect(holds).toEqual(["1", "2"]); // one hold per request for the two steps calling "add"
    expect(released).toBe(2);
    expect(v1.calls.length).toBe(2);
    const perVersion = ensemble
      .stepStatistics()
      .map((s) => [s.step, s.version, s.statistics.inferenceStats?.success?.count]);
    expect(perVersion).toEqual([
      [0, "1", 1n],
      [0, "2", 1n],
      [1, "1", 1n],
      [1, "2", 1n],
    ]);
  });

  it("a step's model not available refuses the request, naming the step, and holds nothing", async () => {
    const add = fnStage(unaryConfig("add"), ({ IN }) => [mapF32(IN!, "OUT", (v) => v + 1)]);
    let released = 0;
    let available = true;
    const holdStep: HoldStep = () => {
      if (!available) throw new StageError(Code.Unavailable, "", "Request for unknown model: 'add' is not found");
      return { stage: add, release: () => released++ };
    };
    const ensemble = await createEnsemble({ config: twice, resolveStep: () => add, holdStep });
    expect(await ensemble.isReady()).toBe(true);
    available = false;
    const err = await ensemble.infer({ inputs: [x(0)] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StageError);
    expect((err as StageError).code).toBe(Code.Unavailable);
    expect((err as StageError).message).toMatch(
      /step 0 add: UNAVAILABLE: Request for unknown model: 'add' is not found/,
    );
    expect(await ensemble.isReady()).toBe(false);
    expect(released).toBe(1); // the readiness check's hold, given back
    expect(add.calls.length).toBe(0);
  });
});
