/** Every load-time error the planner raises, each from a config that has exactly that problem. */
import type { ModelConfig } from "@trellis/protocol";
import { Code } from "@trellis/stage";
import { notFound } from "@trellis/stage/backend";
import { describe, expect, it } from "vitest";
import { createEnsemble } from "../src/index.js";
import { cfg, fnStage, mapF32, unaryConfig } from "./helpers.js";

const identity = (config: ModelConfig) => fnStage(config, ({ IN }) => [mapF32(IN!, "OUT", (v) => v)]);

/** A fresh ensemble config: one FP32 [4] input X, output Y, the given steps. */
const ensemble = (steps: string[], opts: { mbs?: number; outputs?: string; inputDims?: string } = {}) =>
  cfg(`
    name: "bad" platform: "ensemble" max_batch_size: ${opts.mbs ?? 8}
    input [ { name: "X" data_type: TYPE_FP32 dims: ${opts.inputDims ?? "[ 4 ]"} } ]
    output [ ${opts.outputs ?? `{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }`} ]
    ensemble_scheduling { step [ ${steps.join(", ")} ] }`);

const step = (model: string, from: string, to: string) =>
  `{ model_name: "${model}" model_version: -1 input_map { key: "IN" value: "${from}" } output_map { key: "OUT" value: "${to}" } }`;

async function loadError(
  config: ModelConfig,
  stages: Record<string, ModelConfig>,
): Promise<{ code: Code; rawMessage: string }> {
  const err = await createEnsemble({
    config,
    resolveStep: (m) => {
      const c = stages[m];
      if (!c) throw notFound(m, `unknown model "${m}"`);
      return identity(c);
    },
  }).then(
    () => undefined,
    (e) => e,
  );
  expect(err, "the ensemble should not load").toBeDefined();
  return err;
}

const a = unaryConfig("a");
const b = unaryConfig("b");

describe("load-time validation", () => {
  it("accepts a valid chain (the baseline the other cases break)", async () => {
    const e = await createEnsemble({
      config: ensemble([step("a", "X", "m"), step("b", "m", "Y")]),
      resolveStep: (m) => identity(m === "a" ? a : b),
    });
    expect(e.plan.steps.map((s) => s.dependsOn)).toEqual([[], [0]]);
  });

  it("unknown model", async () => {
    const err = await loadError(ensemble([step("a", "X", "m"), step("nope", "m", "Y")]), { a });
    expect(err.code).toBe(Code.NotFound);
    expect(err.rawMessage).toBe('bad: step 1 nope: NOT_FOUND: unknown model "nope"');
  });

  it("a tensor read that nothing produces", async () => {
    const err = await loadError(ensemble([step("a", "X", "m"), step("b", "typo", "Y")]), { a, b });
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain(
      'step 1 b: input "IN" reads tensor "typo", which no step or ensemble input produces',
    );
  });

  it("a tensor written twice", async () => {
    const err = await loadError(ensemble([step("a", "X", "Y"), step("b", "X", "Y")]), { a, b });
    expect(err.rawMessage).toContain(
      'tensor "Y" is written twice: by step 0 a output "OUT" and by step 1 b output "OUT"',
    );
  });

  it("a step writing an ensemble input", async () => {
    const err = await loadError(ensemble([step("a", "X", "X"), step("b", "X", "Y")]), { a, b });
    expect(err.rawMessage).toContain('tensor "X" is written twice: by ensemble input "X" and by step 0 a output "OUT"');
  });

  it("a cycle", async () => {
    const c = unaryConfig("c");
    const joinConfig = cfg(`
      name: "j" backend: "typescript" max_batch_size: 8
      input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "BACK" data_type: TYPE_FP32 dims: [ 4 ] } ]
      output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]`);
    const config = ensemble([
      step("a", "p", "q"),
      `{ model_name: "j" model_version: -1 input_map { key: "IN" value: "X" } input_map { key: "BACK" value: "r" } output_map { key: "OUT" value: "p" } }`,
      step("c", "q", "r"),
      step("b", "q", "Y"),
    ]);
    const err = await loadError(config, { a, b, c, j: joinConfig });
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain("cycle: step 0 a -> step 2 c -> step 1 j -> step 0 a");
  });

  it("a datatype mismatch between producer and consumer", async () => {
    const b16 = unaryConfig("b", { datatype: "TYPE_FP16" });
    const err = await loadError(ensemble([step("a", "X", "m"), step("b", "m", "Y")]), { a, b: b16 });
    expect(err.rawMessage).toContain(
      'tensor "m": step 0 a output "OUT" is FP32 [-1,4], but step 1 b input "IN" expects FP16 [-1,4]',
    );
  });

  it("a shape mismatch between producer and consumer", async () => {
    const b5 = unaryConfig("b", { dims: "[ 5 ]" });
    const err = await loadError(ensemble([step("a", "X", "m"), step("b", "m", "Y")]), { a, b: b5 });
    expect(err.rawMessage).toContain(
      'step 0 a output "OUT" is FP32 [-1,4], but step 1 b input "IN" expects FP32 [-1,5]',
    );
  });

  it("compares shapes batch-aware: a batching producer feeds a non-batching consumer, with or without the batch dim", async () => {
    const flat = unaryConfig("b", { mbs: 0, dims: "[ 4 ]" });
    const explicit = unaryConfig("b", { mbs: 0, dims: "[ -1, 4 ]" });
    const config = (out = "[ -1, 4 ]") =>
      ensemble([step("a", "X", "m"), step("b", "m", "Y")], {
        mbs: 0,
        inputDims: "[ -1, 4 ]",
        outputs: `{ name: "Y" data_type: TYPE_FP32 dims: ${out} }`,
      });
    // a batches: its output is [-1,4]. b without batching may declare that leading dim itself (the full
    // shapes agree) or not (the dims agree): Triton loads both and leaves the rest to run time.
    for (const [b, out] of [
      [flat, "[ 4 ]"],
      [explicit, "[ -1, 4 ]"],
    ] as const) {
      const ok = await createEnsemble({ config: config(out), resolveStep: (m) => identity(m === "a" ? a : b) });
      expect(ok.plan.steps).toHaveLength(2);
    }
    const five = unaryConfig("b", { mbs: 0, dims: "[ 5 ]" });
    const err = await loadError(config("[ 5 ]"), { a, b: five });
    expect(err.rawMessage).toContain('step 0 a output "OUT" is FP32 [-1,4], but step 1 b input "IN" expects FP32 [5]');
  });

  it("loads a non-batching ensemble over a batching step when the full shapes agree (Triton's rule)", async () => {
    // Triton core (ensemble_utils ValidateTensorConsistency): consistent when the dims agree, or the
    // full shapes (the batch dim included where a model batches) do.
    const step8 = unaryConfig("b", { mbs: 8, dims: "[ -1 ]" });
    const config = ensemble([step("b", "X", "Y")], {
      mbs: 0,
      inputDims: "[ -1, -1 ]",
      outputs: `{ name: "Y" data_type: TYPE_FP32 dims: [ -1, -1 ] }`,
    });
    const ok = await createEnsemble({ config, resolveStep: () => identity(step8) });
    expect(ok.plan.steps).toHaveLength(1);
    // The dims agree ([-1] and [-1]) though the full shapes do not ([-1] and [-1,-1]): Triton loads it too.
    const byDims = ensemble([step("b", "X", "Y")], {
      mbs: 0,
      inputDims: "[ -1 ]",
      outputs: `{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }`,
    });
    const alsoOk = await createEnsemble({ config: byDims, resolveStep: () => identity(step8) });
    expect(alsoOk.plan.steps).toHaveLength(1);
    // Neither the dims ([3,4] against [5]) nor the full shapes ([3,4] against [-1,5]) agree: still refused.
    const fixed = unaryConfig("b", { mbs: 8, dims: "[ 5 ]" });
    const refused = ensemble([step("b", "X", "Y")], {
      mbs: 0,
      inputDims: "[ 3, 4 ]",
      outputs: `{ name: "Y" data_type: TYPE_FP32 dims: [ 3, 5 ] }`,
    });
    const err = await loadError(refused, { b: fixed });
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain('ensemble input "X" is FP32 [3,4], but step 0 b input "IN" expects FP32 [-1,5]');
  });

  it("an ensemble max_batch_size larger than a step's", async () => {
    const small = unaryConfig("b", { mbs: 4 });
    const err = await loadError(ensemble([step("a", "X", "m"), step("b", "m", "Y")]), { a, b: small });
    expect(err.rawMessage).toContain("ensemble max_batch_size 8 is larger than step 1 b's max_batch_size 4");
  });

  it("an ensemble output nobody produces", async () => {
    const config = ensemble([step("a", "X", "m"), step("b", "m", "Y")], {
      outputs: `{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "EXTRA" data_type: TYPE_FP32 dims: [ 4 ] }`,
    });
    const err = await loadError(config, { a, b });
    expect(err.rawMessage).toContain('ensemble output "EXTRA" is not produced by any step');
  });

  it("input_map / output_map naming tensors the step does not have", async () => {
    const config = ensemble([
      `{ model_name: "a" model_version: -1 input_map { key: "INPUT" value: "X" } output_map { key: "OUT" value: "m" } }`,
      `{ model_name: "b" model_version: -1 input_map { key: "IN" value: "m" } output_map { key: "RESULT" value: "Y" } }`,
    ]);
    const err = await loadError(config, { a, b });
    expect(err.rawMessage).toContain('step 0 a: input_map names input "INPUT", but a has inputs [IN]');
    expect(err.rawMessage).toContain('step 0 a: required input "IN" is not in input_map');
    expect(err.rawMessage).toContain('step 1 b: output_map names output "RESULT", but b has outputs [OUT]');
  });

  it("an ensemble config without steps", async () => {
    const err = await createEnsemble({
      config: cfg(`name: "empty" platform: "ensemble" input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]`),
      resolveStep: () => identity(a),
    }).catch((e) => e);
    expect(err.rawMessage).toBe("empty: an ensemble needs ensemble_scheduling with at least one step");
  });
});
