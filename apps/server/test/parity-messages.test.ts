/**
 * Parity (issue 22, item 4): a request that does not fit its model is refused with Triton's own
 * words, over HTTP and gRPC, for every kind of model: the seed ensemble, its TypeScript steps and
 * an ONNX model. Clients match these texts (tritonclient users, Triton's qa tests), so Trellis's
 * text starts with Triton's; a Trellis detail may follow it, never replace it.
 *
 * The texts are those of Triton's core: triton-inference-server/core src/infer_request.cc
 * (InferenceRequest::Normalize and ValidateRequestInputs: input count, batch dimension, batch-size,
 * data-type, shape, byte size, string element count; each prefixed "[request id: <id>] " with
 * "<id_unknown>" for a request without an id) and src/model.cc (Model::GetInput / GetOutput:
 * "unexpected inference input/output", without the prefix). The checks run in Normalize's order.
 */
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import {
  grpcJsInferenceClient,
  identityModel,
  makeSeedRepository,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { addModel, postJson } from "./helpers.js";

/** An ONNX model with two batched inputs of different types (outputs A_out, B_out). */
const PAIR_CONFIG = `name: "pair"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 3 ] }
]
output [
  { name: "A_out" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "B_out" data_type: TYPE_INT32 dims: [ 3 ] }
]
`;

interface T {
  name: string;
  datatype: "FP32" | "INT32" | "BYTES";
  shape: number[];
  data: (number | string)[];
}

const NONE = "[request id: <id_unknown>] ";
const NOTE =
  "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size.";

const img = (n: number): T => ({ name: "RAW_IMAGE", datatype: "BYTES", shape: [n, 1], data: Array(n).fill("x") });
const a = (n: number): T => ({ name: "A", datatype: "FP32", shape: [n, 2], data: Array(2 * n).fill(1) });
const b = (n: number): T => ({ name: "B", datatype: "INT32", shape: [n, 3], data: Array(3 * n).fill(1) });

/** Each case: the model, the inputs (and outputs asked for), and the text Triton answers with. */
const CASES: { title: string; model: string; inputs: T[]; outputs?: string[]; id?: string; triton: string }[] = [
  {
    title: "a wrong data-type",
    model: "resnet50_ensemble",
    inputs: [{ name: "RAW_IMAGE", datatype: "FP32", shape: [1, 1], data: [0] }],
    triton: `${NONE}inference input 'RAW_IMAGE' data-type is 'FP32', but model 'resnet50_ensemble' expects 'BYTES'`,
  },
  {
    title: "an input the model does not have",
    model: "resnet50_ensemble",
    inputs: [{ ...img(1), name: "IMAGE" }],
    triton: "unexpected inference input 'IMAGE' for model 'resnet50_ensemble'",
  },
  {
    title: "a wrong shape",
    model: "resnet50_ensemble",
    inputs: [{ ...img(1), shape: [1, 2], data: ["x", "y"] }],
    triton: `${NONE}unexpected shape for input 'RAW_IMAGE' for model 'resnet50_ensemble'. Expected [-1,1], got [1,2]. ${NOTE}`,
  },
  {
    title: "a batch over max_batch_size (ensemble)",
    model: "resnet50_ensemble",
    inputs: [img(5)],
    triton: `${NONE}inference request batch-size must be <= 4 for 'resnet50_ensemble'`,
  },
  {
    title: "an output the model does not have",
    model: "resnet50_ensemble",
    inputs: [img(1)],
    outputs: ["X"],
    triton: "unexpected inference output 'X' for model 'resnet50_ensemble'",
  },
  {
    title: "a request id, in Triton's prefix",
    model: "resnet50_ensemble",
    inputs: [img(5)],
    id: "req-7",
    triton: "[request id: req-7] inference request batch-size must be <= 4 for 'resnet50_ensemble'",
  },
  {
    title: "a wrong data-type (TypeScript step)",
    model: "resnet50_postprocess",
    inputs: [{ name: "LOGITS", datatype: "INT32", shape: [1, 1000], data: Array(1000).fill(0) }],
    triton: `${NONE}inference input 'LOGITS' data-type is 'INT32', but model 'resnet50_postprocess' expects 'FP32'`,
  },
  {
    title: "an input the model does not have (TypeScript step)",
    model: "resnet50_preprocess",
    inputs: [{ ...img(1), name: "IMAGE" }],
    triton: "unexpected inference input 'IMAGE' for model 'resnet50_preprocess'",
  },
  {
    title: "a missing input (ONNX)",
    model: "pair",
    inputs: [a(1)],
    triton: `${NONE}expected 2 inputs but got 1 inputs for model 'pair'. Got input(s) ['A'], but missing required input(s) ['B']. Please provide all required input(s).`,
  },
  {
    title: "inputs with different batch sizes (ONNX)",
    model: "pair",
    inputs: [a(1), b(2)],
    triton: `${NONE}input 'B' batch size does not match other inputs for 'pair'`,
  },
  {
    title: "a batch over max_batch_size (ONNX)",
    model: "pair",
    inputs: [a(9), b(9)],
    triton: `${NONE}inference request batch-size must be <= 8 for 'pair'`,
  },
  {
    title: "a wrong data-type (ONNX)",
    model: "pair",
    inputs: [a(1), { ...b(1), datatype: "FP32" }],
    triton: `${NONE}inference input 'B' data-type is 'FP32', but model 'pair' expects 'INT32'`,
  },
  {
    title: "a wrong shape (ONNX)",
    model: "pair",
    inputs: [a(1), { ...b(1), shape: [1, 4], data: [1, 2, 3, 4] }],
    triton: `${NONE}unexpected shape for input 'B' for model 'pair'. Expected [-1,3], got [1,4]. ${NOTE}`,
  },
  {
    title: "an output the model does not have (ONNX)",
    model: "pair",
    inputs: [a(1), b(1)],
    outputs: ["C_out"],
    triton: "unexpected inference output 'C_out' for model 'pair'",
  },
];

/** Raw bytes of a tensor, as tritonclient sends them over gRPC. */
function raw(t: T): Buffer {
  if (t.datatype === "FP32") return Buffer.from(new Float32Array(t.data as number[]).buffer);
  if (t.datatype === "INT32") return Buffer.from(new Int32Array(t.data as number[]).buffer);
  return Buffer.concat(
    (t.data as string[]).flatMap((s) => {
      const len = Buffer.alloc(4);
      len.writeUInt32LE(Buffer.byteLength(s));
      return [len, Buffer.from(s)];
    }),
  );
}

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeSeedRepository({
    prefix: "trellis-parity-messages-",
    editConfig: (model, config) =>
      model === "resnet50_ensemble" ? config.replace("max_batch_size: 256", "max_batch_size: 4") : config,
  });
  await addModel(repo, "pair", { config: PAIR_CONFIG });
  await writeFile(
    join(repo, "pair", "1", "model.onnx"),
    identityModel([
      { name: "A", type: "float32", shape: ["N", 2] },
      { name: "B", type: "int32", shape: ["N", 3] },
    ]),
  );
  server = await startServerProcess(["--model-repository", repo]);
}, 120_000);
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

describe("request refusals in Triton's words", () => {
  it.each(CASES)("HTTP: $title → 400 with Triton's text first", async (c) => {
    const body = {
      ...(c.id ? { id: c.id } : {}),
      inputs: c.inputs,
      ...(c.outputs ? { outputs: c.outputs.map((name) => ({ name })) } : {}),
    };
    const { status, json } = await postJson(`${server.http}/v2/models/${c.model}/infer`, body);
    expect(status).toBe(400);
    expect(typeof json.error).toBe("string");
    expect((json.error as string).slice(0, c.triton.length)).toBe(c.triton);
    expect(json.error).not.toContain(repo);
  });

  it.each(CASES)("gRPC: $title → INVALID_ARGUMENT with Triton's text first", async (c) => {
    const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      const err = await client
        .modelInfer({
          model_name: c.model,
          ...(c.id ? { id: c.id } : {}),
          inputs: c.inputs.map((t) => ({ name: t.name, datatype: t.datatype, shape: t.shape })),
          outputs: (c.outputs ?? []).map((name) => ({ name })),
          raw_input_contents: c.inputs.map(raw),
        })
        .then(
          () => undefined,
          (e: { code: number; details: string }) => e,
        );
      expect(err).toBeDefined();
      expect(err!.code).toBe(3); // INVALID_ARGUMENT
      expect(err!.details.slice(0, c.triton.length)).toBe(c.triton);
      expect(err!.details).not.toContain(repo);
    } finally {
      client.close();
    }
  });

  // Raw bytes of the wrong length: Normalize's "input byte size mismatch" (infer_request.cc).
  const short = (model: string, id?: string) =>
    `[request id: ${id ?? "<id_unknown>"}] input byte size mismatch for input 'A' for model '${model}'. Expected 8, got 4`;

  it("HTTP: binary data of the wrong byte size → 400 with Triton's text first", async () => {
    const header = new TextEncoder().encode(
      JSON.stringify({
        inputs: [
          { name: "A", datatype: "FP32", shape: [1, 2], parameters: { binary_data_size: 4 } },
          { name: "B", datatype: "INT32", shape: [1, 3], parameters: { binary_data_size: 12 } },
        ],
      }),
    );
    const body = Buffer.concat([header, Buffer.alloc(4), raw(b(1))]);
    const res = await fetch(`${server.http}/v2/models/pair/infer`, {
      method: "POST",
      body,
      headers: { "content-type": "application/octet-stream", "inference-header-content-length": `${header.length}` },
    });
    expect(res.status).toBe(400);
    const error = ((await res.json()) as { error: string }).error;
    expect(error.slice(0, short("pair").length)).toBe(short("pair"));
  });

  it("gRPC: raw contents of the wrong byte size → INVALID_ARGUMENT with Triton's text first", async () => {
    const client = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      const err = await client
        .modelInfer({
          model_name: "pair",
          id: "r1",
          inputs: [
            { name: "A", datatype: "FP32", shape: [1, 2] },
            { name: "B", datatype: "INT32", shape: [1, 3] },
          ],
          raw_input_contents: [Buffer.alloc(4), raw(b(1))],
        })
        .then(
          () => undefined,
          (e: { code: number; details: string }) => e,
        );
      expect(err?.code).toBe(3);
      expect(err!.details.slice(0, short("pair", "r1").length)).toBe(short("pair", "r1"));
    } finally {
      client.close();
    }
  });

  it("a good request to each model still answers", async () => {
    const pair = await postJson(`${server.http}/v2/models/pair/infer`, { inputs: [a(2), b(2)] });
    expect(pair.status).toBe(200);
    expect(pair.json.outputs.map((o: { name: string }) => o.name).sort()).toEqual(["A_out", "B_out"]);
  });
});
