/**
 * System shared memory through handleModelInfer, on regions in a temporary
 * folder standing in for /dev/shm: which raw_input_contents entry is whose when
 * some inputs are in shared memory, typed contents beside them, outputs written.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { create } from "@bufbuild/protobuf";
import { stageRegistry } from "@trellis/kserve";
import { parametersToWire, SystemSharedMemory } from "@trellis/kserve/wire";
import { ModelInferRequestSchema, parseModelConfig } from "@trellis/protocol";
import { defineStage, tensor } from "@trellis/stage";
import { afterAll, describe, expect, it } from "vitest";
import { handleModelInfer } from "../src/grpc/infer.js";

const dir = mkdtempSync(join(tmpdir(), "trellis-shm-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A model answering SUM = A + B + C (FP32 [2]) and, as given, A. */
const adder = defineStage({
  config: parseModelConfig(`name: "adder" backend: "typescript" max_batch_size: 0
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 2 ] },
            { name: "C" data_type: TYPE_FP32 dims: [ 2 ] } ]
    output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "A_OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]`),
  compute(request) {
    const [a, b, c] = ["A", "B", "C"].map((n) => request.inputs.find((t) => t.name === n)?.data as Float32Array);
    return [
      tensor(
        "SUM",
        "FP32",
        [2],
        Float32Array.from(a as Float32Array, (v, i) => v + (b?.[i] ?? 0) + (c?.[i] ?? 0)),
      ),
      tensor("A_OUT", "FP32", [2], Float32Array.from(a as Float32Array)),
    ];
  },
});
const registry = stageRegistry(adder);

const bytes = (...v: number[]) => new Uint8Array(Float32Array.from(v).buffer);
const shm = (region: string, byteSize: number, offset = 0) =>
  parametersToWire({
    shared_memory_region: region,
    shared_memory_byte_size: byteSize,
    ...(offset ? { shared_memory_offset: offset } : {}),
  });

function regions() {
  const memory = new SystemSharedMemory(dir);
  // One object holding B at byte 0 and room for an output at byte 16.
  writeFileSync(join(dir, "obj"), new Uint8Array(64));
  writeFileSync(join(dir, "obj"), bytes(10, 20), { flag: "r+" });
  memory.register("b_region", "/obj", 0, 8);
  memory.register("out_region", "/obj", 16, 32);
  return memory;
}
const input = (name: string, extra: object = {}) => ({ name, datatype: "FP32", shape: [2n], ...extra });

describe("handleModelInfer with system shared memory", () => {
  it("matches raw_input_contents to the inputs not in shared memory, as tritonclient sends them", async () => {
    const memory = regions();
    const response = await handleModelInfer(
      registry,
      create(ModelInferRequestSchema, {
        modelName: "adder",
        inputs: [input("A"), input("B", { parameters: shm("b_region", 8) }), input("C")],
        rawInputContents: [bytes(1, 2), bytes(100, 200)], // A and C: B is in shared memory
        outputs: [{ name: "SUM", parameters: shm("out_region", 8, 4) }, { name: "A_OUT" }],
      }),
      new AbortController().signal,
      { sharedMemory: memory },
    );
    // SUM went to the object at 16 + 4; A_OUT came back in the message, in its own place.
    expect([...new Float32Array(Uint8Array.from(readFileSync(join(dir, "obj"))).buffer.slice(20, 28))]).toEqual([
      111, 222,
    ]);
    expect(response.outputs.map((o) => o.name)).toEqual(["SUM", "A_OUT"]);
    expect(response.rawOutputContents[0]?.byteLength).toBe(0);
    expect([...new Float32Array(Uint8Array.from(response.rawOutputContents[1] as Uint8Array).buffer)]).toEqual([1, 2]);
    expect(response.outputs[0]?.parameters.shared_memory_offset?.parameterChoice.value).toBe(4n);
    memory.close();
  });

  it("also takes one raw entry per input, and typed contents beside shared memory", async () => {
    const memory = regions();
    const perInput = await handleModelInfer(
      registry,
      create(ModelInferRequestSchema, {
        modelName: "adder",
        inputs: [input("A"), input("B", { parameters: shm("b_region", 8) }), input("C")],
        rawInputContents: [bytes(1, 2), new Uint8Array(0), bytes(100, 200)],
      }),
      new AbortController().signal,
      { sharedMemory: memory },
    );
    const sum = (r: typeof perInput) => [
      ...new Float32Array(Uint8Array.from(r.rawOutputContents[0] as Uint8Array).buffer),
    ];
    expect(sum(perInput)).toEqual([111, 222]);
    const typed = await handleModelInfer(
      registry,
      create(ModelInferRequestSchema, {
        modelName: "adder",
        inputs: [
          input("A", { contents: { fp32Contents: [1, 2] } }),
          input("B", { parameters: shm("b_region", 8) }),
          input("C", { contents: { fp32Contents: [100, 200] } }),
        ],
      }),
      new AbortController().signal,
      { sharedMemory: memory },
    );
    expect(sum(typed)).toEqual([111, 222]);
    memory.close();
  });

  it("refuses a raw_input_contents count that fits neither way, and regions on a server without shared memory", async () => {
    const memory = regions();
    const request = create(ModelInferRequestSchema, {
      modelName: "adder",
      inputs: [input("A"), input("B", { parameters: shm("b_region", 8) }), input("C")],
      rawInputContents: [bytes(1, 2)],
    });
    await expect(
      handleModelInfer(registry, request, new AbortController().signal, { sharedMemory: memory }),
    ).rejects.toThrow(/raw_input_contents has 1 entries for 3 inputs, 1 of them in shared memory/);
    await expect(handleModelInfer(registry, request, new AbortController().signal)).rejects.toThrow(
      /names shared memory regions, but this server takes none/,
    );
    memory.close();
  });
});
