/**
 * Optional inputs (`optional: true` in config.pbtxt), checked as Triton's core checks them
 * (src/infer_request.cc, InferenceRequest::ValidateRequestInputs): a request may leave an
 * optional input out; fewer inputs than the required ones, or more than the config has, are
 * refused INVALID_ARGUMENT with core's text ("expected number of inputs between R and N …" when
 * some input is optional). The checks are the core's, the same for every backend; the model here
 * are a TypeScript one that answers an input left out with a default, and ONNX ones built here
 * whose optional inputs are graph inputs with an initializer (as Triton's onnxruntime backend takes
 * them: onnxruntime uses the initializer when the request leaves the input out).
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { graphModel, removeDir, type ServerProcess, startServerProcess, type ToyTensor } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcClientOf, makeRepository, postJson } from "./helpers.js";

const input = (name: string, optional: boolean) =>
  `{ name: "${name}" data_type: TYPE_FP32 dims: [ 1 ]${optional ? " optional: true" : ""} }`;
const config = (name: string, optionalA: boolean) => `name: "${name}"
backend: "typescript"
max_batch_size: 0
input [ ${input("A", optionalA)}, ${input("B", true)} ]
output [ { name: "A_out" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "B_out" data_type: TYPE_FP32 dims: [ 1 ] } ]
`;
/** A_out = A, B_out = B; an input left out gives its default: `a`, `b` (as an ONNX initializer would). */
const model = (a: number, b: number) => `
export function createStage({ config }) {
  return { config, compute(request) {
    const value = (name, fallback) => request.inputs.find((t) => t.name === name)?.data[0] ?? fallback;
    return [
      { name: "A_out", datatype: "FP32", shape: [1], data: Float32Array.of(value("A", ${a})) },
      { name: "B_out", datatype: "FP32", shape: [1], data: Float32Array.of(value("B", ${b})) },
    ];
  } };
}
`;

/** A_out = Identity(A), B_out = Identity(B); B (and A when `defaultA` is given) a graph input with an initializer. */
const onnxModel = (defaultA: number | undefined, defaultB: number) => {
  const t = (name: string): ToyTensor => ({ name, type: "float32", shape: [1] });
  const initializer = (name: string, value: number) => ({ name, dims: [1], values: Float32Array.of(value) });
  return graphModel(
    [
      { op: "Identity", inputs: ["A"], outputs: ["A_out"] },
      { op: "Identity", inputs: ["B"], outputs: ["B_out"] },
    ],
    [t("A"), t("B")],
    [t("A_out"), t("B_out")],
    {},
    [...(defaultA === undefined ? [] : [initializer("A", defaultA)]), initializer("B", defaultB)],
  );
};
const onnxConfig = (name: string, optionalA: boolean) =>
  config(name, optionalA).replace('backend: "typescript"', 'platform: "onnxruntime_onnx"');

let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  repo = await makeRepository({
    opt: { config: config("opt", false), files: { "1/model.mjs": model(Number.NaN, -1) } },
    all_opt: { config: config("all_opt", true), files: { "1/model.mjs": model(-2, -1) } },
    onnx_opt: { config: onnxConfig("onnx_opt", false), files: { "1/model.onnx": onnxModel(undefined, -1) } },
    onnx_all_opt: { config: onnxConfig("onnx_all_opt", true), files: { "1/model.onnx": onnxModel(-2, -1) } },
    // An optional input that is neither a model input nor an initializer: refused at load, named.
    onnx_no_default: {
      config: onnxConfig("onnx_no_default", false).replace('name: "B" data_type', 'name: "C" data_type'),
      files: { "1/model.onnx": onnxModel(undefined, -1) },
    },
  });
  server = await startServerProcess(["--model-repository", repo, "--exit-on-error=false"]);
});

afterAll(async () => {
  await server?.stop();
  if (repo) await removeDir(repo);
});

type Inputs = Record<string, number>;
const http = (name: string, inputs: Inputs) =>
  postJson(`${server.http}/v2/models/${name}/infer`, {
    inputs: Object.entries(inputs).map(([n, v]) => ({ name: n, datatype: "FP32", shape: [1], data: [v] })),
  });
const grpc = (name: string, inputs: Inputs) =>
  grpcClientOf(server)
    .modelInfer({
      modelName: name,
      inputs: Object.keys(inputs).map((n) => ({ name: n, datatype: "FP32", shape: [1n] })),
      rawInputContents: Object.values(inputs).map((v) => new Uint8Array(Float32Array.of(v).buffer)),
    })
    .then(
      (r) => ({
        outputs: r.outputs.map((o, i) => [o.name, new Float32Array(r.rawOutputContents[i]!.slice().buffer)[0]]),
      }),
      (e: unknown) => ({ error: ConnectError.from(e) }),
    );
const outputsOf = (json: { outputs: { name: string; data: number[] }[] }) =>
  json.outputs.map((o) => [o.name, o.data[0]]);

const missingA = (model: string) =>
  `[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 0 inputs for model '${model}'. Got input(s) [], but missing required input(s) ['A']. Please provide all required input(s).`;

/** Why a request may not give an ONNX model's initializer input (onnxruntime-node would drop the feed). */
const cannotOverride = (model: string, input: string) =>
  `input '${input}' of model '${model}' is an initializer of the ONNX model, which onnxruntime-node cannot override: leave it out to use the model's own value`;

describe.each([
  { kind: "TypeScript", opt: "opt", allOpt: "all_opt", overrides: true },
  { kind: "ONNX (initializers as defaults)", opt: "onnx_opt", allOpt: "onnx_all_opt", overrides: false },
])("optional inputs of a $kind model, as Triton's core checks them", ({ opt, allOpt, overrides }) => {
  it("answers with an optional input left out (its default computed), over HTTP and gRPC", async () => {
    const both = await http(opt, { A: 1, B: 2 });
    if (overrides) {
      expect(outputsOf(both.json)).toEqual([
        ["A_out", 1],
        ["B_out", 2],
      ]);
    } else {
      expect(both.status).toBe(400);
      expect(both.json.error).toContain(cannotOverride(opt, "B"));
    }
    const onlyA = await http(opt, { A: 3 });
    expect(onlyA.status).toBe(200);
    expect(outputsOf(onlyA.json)).toEqual([
      ["A_out", 3],
      ["B_out", -1],
    ]);
    expect(await grpc(opt, { A: 4 })).toEqual({
      outputs: [
        ["A_out", 4],
        ["B_out", -1],
      ],
    });
  });

  it("refuses a request missing a required input with core's text (INVALID_ARGUMENT, 400)", async () => {
    const none = await http(opt, {});
    expect(none).toEqual({ status: 400, json: { error: missingA(opt) } });
    const viaGrpc = await grpc(opt, {});
    expect("error" in viaGrpc && viaGrpc.error.code).toBe(Code.InvalidArgument);
    expect("error" in viaGrpc && viaGrpc.error.rawMessage).toBe(missingA(opt));
    const extra = await http(opt, { A: 1, B: 2, C: 3 });
    expect(extra.status).toBe(400);
    expect(extra.json.error).toBe(
      `[request id: <id_unknown>] expected number of inputs between 1 and 2 but got 3 inputs for model '${opt}'. Got input(s) ['A','B','C'], but missing required input(s) ]. Please provide all required input(s).`,
    );
  });

  it("answers an empty request to a model whose inputs are all optional, from its defaults", async () => {
    const empty = await http(allOpt, {});
    expect(empty.status).toBe(200);
    expect(outputsOf(empty.json)).toEqual([
      ["A_out", -2],
      ["B_out", -1],
    ]);
    const overridden = await grpc(allOpt, { A: 5 });
    if (overrides) {
      expect(overridden).toEqual({
        outputs: [
          ["A_out", 5],
          ["B_out", -1],
        ],
      });
    } else {
      expect("error" in overridden && overridden.error.code).toBe(Code.InvalidArgument);
      expect("error" in overridden && overridden.error.rawMessage).toContain(cannotOverride(allOpt, "A"));
    }
  });
});

describe("an ONNX model whose config names an input it has neither as input nor as initializer", () => {
  it("is not loaded, and says which input and what the model has", async () => {
    const index = await postJson(`${server.http}/v2/repository/index`, {});
    const entry = (index.json as { name: string; state: string; reason: string }[]).find(
      (m) => m.name === "onnx_no_default",
    );
    expect(entry?.state).toBe("UNAVAILABLE");
    expect(entry?.reason).toContain(
      "config input C is not a model input; the model's inputs are A (and initializers B)",
    );
  });
});
