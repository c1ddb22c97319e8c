/**
 * Stateful models (sequence_batching), black-box: @trellis/testing's ONNX
 * accumulator served from a repository, one sequence driven over gRPC and
 * another over HTTP at the same time, each keeping its own implicit state,
 * and Triton's refusals for requests outside a sequence.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { InferParameterSchema, type ModelInferRequest, ModelInferRequestSchema } from "@trellis/protocol";
import {
  ACCUMULATOR_CONFIG,
  accumulatorModel,
  grpcJsInferenceClient,
  removeDir,
  type ServerProcess,
  startServerProcess,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { floats, grpcClientOf, jsonOf, makeRepository, metricValue, postJson, scrape } from "./helpers.js";

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({
    accumulate: { config: `name: "accumulate"\n${ACCUMULATOR_CONFIG}`, files: { "1/model.onnx": accumulatorModel() } },
  });
  server = await startServerProcess(["--model-repository", repo]);
});
afterAll(async () => {
  expect(await server.stop()).toBe(0);
  await removeDir(repo);
});

type Flags = { id: bigint; start?: boolean; end?: boolean };

/** A ModelInferRequest for the accumulator, sequence_id as a uint64 parameter. */
function grpcRequest(value: number, { id, start, end }: Flags): ModelInferRequest {
  const parameters: ModelInferRequest["parameters"] = {
    sequence_id: create(InferParameterSchema, { parameterChoice: { case: "uint64Param", value: id } }),
  };
  if (start)
    parameters.sequence_start = create(InferParameterSchema, { parameterChoice: { case: "boolParam", value: true } });
  if (end)
    parameters.sequence_end = create(InferParameterSchema, { parameterChoice: { case: "boolParam", value: true } });
  return create(ModelInferRequestSchema, {
    modelName: "accumulate",
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 1n] }],
    rawInputContents: [new Uint8Array(Float32Array.of(value).buffer)],
    parameters,
  });
}

/** The accumulator over HTTP/JSON, sequence flags as request parameters. */
async function httpInfer(value: number, parameters: Record<string, unknown>, shape = [1, 1]) {
  return postJson(`${server.http}/v2/models/accumulate/infer`, {
    inputs: [{ name: "INPUT", datatype: "FP32", shape, data: Array(shape[0]).fill(value) }],
    parameters,
  });
}

describe("sequence batching", () => {
  it("keeps each sequence's state, one over gRPC and one over HTTP, interleaved; control inputs stay the server's", async () => {
    const client = grpcClientOf(server);
    const grpcSum = async (value: number, flags: Flags) => {
      const res = await client.modelInfer(grpcRequest(value, flags));
      const out = res.outputs.findIndex((o) => o.name === "OUTPUT");
      return floats(res.rawOutputContents[out]!)[0];
    };
    const httpSum = async (value: number, parameters: Record<string, unknown>) => {
      const res = await httpInfer(value, parameters);
      expect(res.status).toBe(200);
      const output = (name: string) => res.json.outputs.find((o: { name: string }) => o.name === name).data[0];
      return [output("OUTPUT"), output("CORRID_SEEN"), output("START_SEEN")];
    };
    expect(await grpcSum(1, { id: 1001n, start: true })).toBe(1);
    expect(await httpSum(10, { sequence_id: 1002, sequence_start: true })).toEqual([10, 1002, 1]);
    expect(await grpcSum(2, { id: 1001n })).toBe(3);
    expect(await httpSum(20, { sequence_id: 1002, sequence_end: true })).toEqual([30, 1002, 0]);
    expect(await grpcSum(3, { id: 1001n, end: true })).toBe(6);

    // grpc-js sends sequence_id as an int64 parameter, as tritonclient does.
    const grpcJs = grpcJsInferenceClient(`127.0.0.1:${server.grpcPort}`);
    try {
      const send = (value: number, parameters: Record<string, unknown>) =>
        grpcJs.modelInfer({
          model_name: "accumulate",
          inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 1] }],
          outputs: [{ name: "OUTPUT" }],
          raw_input_contents: [Buffer.from(Float32Array.of(value).buffer)],
          parameters,
        });
      await send(5, { sequence_id: { int64_param: 77 }, sequence_start: { bool_param: true } });
      const second = await send(6, { sequence_id: { int64_param: 77 }, sequence_end: { bool_param: true } });
      expect(second.outputs.map((o) => o.name)).toEqual(["OUTPUT"]);
      expect(floats(second.raw_output_contents[0]!)[0]).toBe(11);
    } finally {
      grpcJs.close();
    }

    const meta = await jsonOf(await fetch(`${server.http}/v2/models/accumulate`));
    expect(meta.inputs.map((t: { name: string }) => t.name)).toEqual(["INPUT"]);
    const stats = await jsonOf(await fetch(`${server.http}/v2/models/accumulate/stats`));
    expect(stats.model_stats[0].inference_count).toBe(7);
  });

  it("refuses requests outside a sequence as Triton does (400 / INVALID_ARGUMENT), and the server goes on", async () => {
    const failuresBefore = metricValue(await scrape(server), "nv_inference_request_failure", "accumulate");
    const noId = await httpInfer(1, {});
    expect(noId.status).toBe(400);
    expect(noId.json.error).toBe(
      "accumulate: inference request to model 'accumulate' must specify a non-zero or non-empty correlation ID",
    );
    const batch = await httpInfer(1, { sequence_id: 5, sequence_start: true }, [2, 1]);
    expect(batch.status).toBe(400);
    expect(batch.json.error).toContain("must specify batch-size 1 due to requirements of sequence batcher");
    const control = await postJson(`${server.http}/v2/models/accumulate/infer`, {
      inputs: [
        { name: "INPUT", datatype: "FP32", shape: [1, 1], data: [1] },
        { name: "START", datatype: "FP32", shape: [1, 1], data: [1] },
      ],
      parameters: { sequence_id: 5, sequence_start: true },
    });
    expect(control.status).toBe(400);
    expect(control.json.error).toContain("input START is supplied by the sequence batcher");

    const client = grpcClientOf(server);
    const notStarted = await client.modelInfer(grpcRequest(1, { id: 4242n })).catch((e: unknown) => e);
    expect(notStarted).toBeInstanceOf(ConnectError);
    expect((notStarted as ConnectError).code).toBe(Code.InvalidArgument);
    expect((notStarted as ConnectError).rawMessage).toBe(
      "accumulate: inference request for sequence 4242 to model 'accumulate' must specify the START flag on the first request of the sequence",
    );
    const fine = await httpInfer(4, { sequence_id: 4242, sequence_start: true, sequence_end: true });
    expect(fine.json.outputs[0].data).toEqual([4]);
    // The four refusals are the model's failed requests in its metrics.
    const failuresAfter = metricValue(await scrape(server), "nv_inference_request_failure", "accumulate");
    expect(failuresAfter - failuresBefore).toBe(4);
  });
});
