/**
 * A stateful ONNX model under sequence_batching: @trellis/testing's
 * accumulator (OUTPUT = INPUT + STATE_IN, Triton's implicit-state example),
 * which echoes START and CORRID so the control tensors ORT got can be checked.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseModelConfig } from "@trellis/protocol";
import { type InferResponse, type Parameters, StageError, tensor } from "@trellis/stage";
import { ACCUMULATOR_CONFIG, accumulatorModel, rejectionOf } from "@trellis/testing";
import { afterAll, describe, expect, it } from "vitest";
import { createOnnxStage, type OnnxStage } from "./serve-onnx.js";

const repo = mkdtempSync(join(tmpdir(), "trellis-onnx-sequence-"));
const stages: OnnxStage[] = [];
afterAll(async () => {
  await Promise.all(stages.map((s) => s.close()));
  rmSync(repo, { recursive: true, force: true });
});

const accumulator = accumulatorModel();
const SEQUENCE = ACCUMULATOR_CONFIG.slice(ACCUMULATOR_CONFIG.indexOf("sequence_batching"));
const IO = ACCUMULATOR_CONFIG.slice(
  ACCUMULATOR_CONFIG.indexOf("input"),
  ACCUMULATOR_CONFIG.indexOf("sequence_batching"),
);

async function load(name: string, config: string, extra: object = {}): Promise<OnnxStage> {
  const dir = join(repo, name);
  mkdirSync(join(dir, "1"), { recursive: true });
  writeFileSync(join(dir, "1", "model.onnx"), accumulator);
  const stage = await createOnnxStage({
    config: parseModelConfig(`name: "${name}" backend: "onnxruntime" max_batch_size: 8\n${config}`),
    modelDir: dir,
    ...extra,
  });
  stages.push(stage);
  return stage;
}

const send = (stage: OnnxStage, value: number, parameters: Parameters) =>
  stage.infer({ inputs: [tensor("INPUT", "FP32", [1, 1], Float32Array.of(value))], parameters });
const read = (res: InferResponse, name: string) => Number(res.outputs.find((t) => t.name === name)!.data[0]);

describe("ONNX sequence_batching", () => {
  it("accumulates each sequence's inputs through the implicit state, batching different sequences' requests together", async () => {
    const stage = await load("accumulate", `${IO}\n${SEQUENCE}`);
    // Eight sequences, each sending its three requests at once: the sequence batcher holds each
    // sequence's requests in order while heads of different sequences share ORT runs.
    const ids = [1, 2, 3, 4, 5, 6, 7, 8];
    const answers = await Promise.all(
      ids.map((id) =>
        Promise.all([
          send(stage, id, { sequence_id: id, sequence_start: true }),
          send(stage, 10 * id, { sequence_id: id }),
          send(stage, 100 * id, { sequence_id: id, sequence_end: true }),
        ]),
      ),
    );
    for (const [i, [first, second, third]] of answers.entries()) {
      const id = ids[i]!;
      expect([read(first!, "OUTPUT"), read(second!, "OUTPUT"), read(third!, "OUTPUT")]).toEqual([
        id,
        11 * id,
        111 * id,
      ]);
      expect([read(first!, "START_SEEN"), read(second!, "START_SEEN")]).toEqual([1, 0]);
      expect(read(third!, "CORRID_SEEN")).toBe(id);
      expect(first!.outputs.map((t) => t.name)).toEqual(["OUTPUT", "START_SEEN", "CORRID_SEEN"]);
    }
    const stats = await stage.statistics();
    expect(Number(stats.inferenceCount)).toBe(24);
    expect(Number(stats.executionCount)).toBeLessThan(24);
  });

  it("auto-completes a config without inputs and outputs from the model, leaving out the control and state tensors", async () => {
    const stage = await load("completed", SEQUENCE, { strictModelConfig: false });
    expect(stage.config.input.map((t) => t.name)).toEqual(["INPUT"]);
    expect(stage.config.output.map((t) => t.name)).toEqual(["OUTPUT", "START_SEEN", "CORRID_SEEN"]);
    const res = await send(stage, 2, { sequence_id: "ignored-by-corrid", sequence_start: true }).catch(
      (e: unknown) => e,
    );
    // A string ID cannot fill a UINT64 CORRID: refused, naming both.
    expect((res as StageError).rawMessage).toContain("is a string, but control input CORRID");
    expect(read(await send(stage, 2, { sequence_id: 77, sequence_start: true }), "OUTPUT")).toBe(2);
  });

  it("refuses to load when the config's control or state tensors are not the model's", async () => {
    const missing = await rejectionOf(
      load("no-begin", `${IO}\n${SEQUENCE.replace('name: "START"', 'name: "BEGIN"')}`),
      StageError,
    );
    expect(missing.rawMessage).toContain(
      "model does not match its config: sequence_batching input BEGIN is not a model input; the model's inputs are INPUT, STATE_IN, START, CORRID",
    );
    const wrongType = await rejectionOf(
      load("int-state", `${IO}\n${SEQUENCE.replaceAll("TYPE_FP32", "TYPE_INT32")}`),
      StageError,
    );
    expect(wrongType.rawMessage).toContain(
      "sequence_batching input STATE_IN: config datatype INT32, model datatype FP32",
    );
    // Without sequence_batching the control and state inputs are inputs the config leaves out.
    const plain = await rejectionOf(load("plain", IO), StageError);
    expect(plain.rawMessage).toContain("model input STATE_IN (float32 [-1,1]) is missing from the config's inputs");
  });
});
