/**
 * Ensemble shape checks as Triton core makes them (ensemble_utils.cc, ValidateTensorConsistency):
 * a tensor is consistent when the dims agree or the full shapes (with the batch dim where a
 * model batches) agree, so a non-batching ensemble of dims [-1,-1] (or [-1]) loads over a step
 * that batches (max_batch_size 8) dims [-1]; shapes that agree neither way are still refused.
 * The steps are ONNX identity models built here.
 */
import { Code, ConnectError } from "@connectrpc/connect";
import { identityModel, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { grpcClientOf, makeRepository, postJson } from "./helpers.js";

const stepConfig = (name: string, dims: string) => `name: "${name}"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: ${dims} } ]
output [ { name: "IN_out" data_type: TYPE_FP32 dims: ${dims} } ]
`;

const ensembleConfig = (name: string, step: string, dims: string) => `name: "${name}"
platform: "ensemble"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_FP32 dims: ${dims} } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: ${dims} } ]
ensemble_scheduling { step [
  { model_name: "${step}" model_version: -1 input_map { key: "IN" value: "X" } output_map { key: "IN_out" value: "Y" } }
] }
`;

let repo: string;
let server: ServerProcess;

beforeAll(async () => {
  const onnx = (rank: number) => ({
    "1/model.onnx": identityModel([{ name: "IN", type: "float32", shape: rank === 2 ? ["N", "M"] : ["N", 5] }]),
  });
  repo = await makeRepository({
    step_any: { config: stepConfig("step_any", "[ -1 ]"), files: onnx(2) },
    step_five: { config: stepConfig("step_five", "[ 5 ]"), files: onnx(1) },
    flat_over_batching: { config: ensembleConfig("flat_over_batching", "step_any", "[ -1, -1 ]") },
    same_dims: { config: ensembleConfig("same_dims", "step_any", "[ -1 ]") },
    mismatched: { config: ensembleConfig("mismatched", "step_five", "[ 3, 4 ]") },
  });
  server = await startServerProcess(["--model-repository", repo, "--exit-on-error=false"]);
});

afterAll(async () => {
  await server?.stop();
  if (repo) await removeDir(repo);
});

describe("a non-batching ensemble over a batching step", () => {
  it("loads when the full shapes agree, and runs", async () => {
    const ready = await fetch(`${server.http}/v2/models/flat_over_batching/ready`);
    expect(ready.status).toBe(200);
    const res = await postJson(`${server.http}/v2/models/flat_over_batching/infer`, {
      inputs: [{ name: "X", datatype: "FP32", shape: [2, 3], data: [1, 2, 3, 4, 5, 6] }],
    });
    expect(res.status).toBe(200);
    expect(res.json.outputs[0].shape).toEqual([2, 3]);
    expect(res.json.outputs[0].data).toEqual([1, 2, 3, 4, 5, 6]);
  });

  it("loads when the dims agree though the full shapes do not ([-1] and [-1,-1])", async () => {
    expect((await grpcClientOf(server).modelReady({ name: "same_dims" })).ready).toBe(true);
  });

  it("passes zero-size and variable shapes as Triton's ensemble scheduler does (ReshapeTensorDims), over HTTP and gRPC", async () => {
    // same_dims: ensemble [-1] (no batching) over a step [-1] that batches. A tensor whose shape is
    // the step's dims gets a batch of 1 in front on the way in, and loses it on the way back.
    const http = async (model: string, shape: number[], data: number[]) =>
      postJson(`${server.http}/v2/models/${model}/infer`, {
        inputs: [{ name: "X", datatype: "FP32", shape, data }],
      });
    for (const [shape, data] of [
      [[0], []],
      [[1], [7]],
      [[3], [1, 2, 3]],
    ] as [number[], number[]][]) {
      const res = await http("same_dims", shape, data);
      expect(res.status, JSON.stringify(res.json)).toBe(200);
      expect(res.json.outputs[0].shape).toEqual(shape);
      expect(res.json.outputs[0].data).toEqual(data);
    }
    const grpc = await grpcClientOf(server).modelInfer({
      modelName: "same_dims",
      inputs: [{ name: "X", datatype: "FP32", shape: [0n] }],
      rawInputContents: [new Uint8Array(0)],
    });
    expect(grpc.outputs[0]?.shape).toEqual([0n]);
    // flat_over_batching: ensemble [-1,-1] over the step [-1]. [2,2] is not the step's dims, so it
    // goes as a batch of 2; [1] is refused by the ensemble's own dims, as Triton's core checks it.
    const square = await http("flat_over_batching", [2, 2], [1, 2, 3, 4]);
    expect(square.status).toBe(200);
    expect(square.json.outputs[0]).toMatchObject({ shape: [2, 2], data: [1, 2, 3, 4] });
    // [0,0] goes as a batch of 0, which Trellis refuses by name: Triton's core lets it through, and
    // its onnxruntime backend then returns on a total batch size of 0 without answering the request
    // (onnxruntime.cc, ProcessRequests: "If there are no valid payloads then no need to run the inference").
    const empty = await http("flat_over_batching", [0, 0], []);
    expect(empty.status).toBe(400);
    expect(empty.json.error).toContain("batch size must be at least 1 for 'step_any', got 0");
    const emptyGrpc = await grpcClientOf(server)
      .modelInfer({
        modelName: "flat_over_batching",
        inputs: [{ name: "X", datatype: "FP32", shape: [0n, 0n] }],
        rawInputContents: [new Uint8Array(0)],
      })
      .catch((e: unknown) => ConnectError.from(e));
    expect(emptyGrpc).toBeInstanceOf(ConnectError);
    expect((emptyGrpc as ConnectError).code).toBe(Code.InvalidArgument);
    expect((emptyGrpc as ConnectError).rawMessage).toContain("batch size must be at least 1 for 'step_any', got 0");
    const flat = await http("flat_over_batching", [1], [1]);
    expect(flat.status).toBe(400);
    expect(flat.json.error).toContain(
      "unexpected shape for input 'X' for model 'flat_over_batching'. Expected [-1,-1], got [1]",
    );
  });

  it("is refused when neither the dims nor the full shapes agree", async () => {
    expect((await grpcClientOf(server).modelReady({ name: "mismatched" })).ready).toBe(false);
    const index = await postJson(`${server.http}/v2/repository/index`, {});
    const entry = index.json.find((m: { name: string }) => m.name === "mismatched");
    expect(entry.state).toBe("UNAVAILABLE");
    expect(entry.reason).toContain(
      'ensemble input "X" is FP32 [3,4], but step 0 step_five input "IN" expects FP32 [-1,5]',
    );
  });
});
