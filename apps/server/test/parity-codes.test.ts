/**
 * Triton parity (issue 22): the status codes and messages Triton answers with, the server
 * metadata's extensions, and classification refused on a BYTES output, over HTTP and gRPC.
 * Each case cites the Triton source it follows (repositories triton-inference-server/server
 * and triton-inference-server/core).
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, type createClient } from "@connectrpc/connect";
import { type GRPCInferenceService, InferParameterSchema, ModelInferRequestSchema } from "@trellis/protocol";
import { makeSeedRepository, rejectionOf, removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { addModel, echoConfig, explicitModels, grpcClientOf, jsonOf, postJson } from "./helpers.js";

let repo: string;
let server: ServerProcess;
let grpc: ReturnType<typeof createClient<typeof GRPCInferenceService>>;

beforeAll(async () => {
  // The seed's models (resnet50_postprocess answers BYTES) beside two echo models, in explicit mode.
  repo = await makeSeedRepository();
  await addModel(repo, "echo", { config: echoConfig("echo") });
  await addModel(repo, "other", { config: echoConfig("other") });
  server = await startServerProcess([
    ...explicitModels(repo, "echo", "other", "resnet50_postprocess"),
    "--http-restricted-api",
    "logging:admin-key=s3cret",
    "--grpc-restricted-protocol",
    "logging:admin-key=s3cret",
  ]);
  grpc = grpcClientOf(server);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

const echoBody = { inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] };
const grpcEcho = (modelName: string, modelVersion = "") =>
  create(ModelInferRequestSchema, {
    modelName,
    modelVersion,
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
    rawInputContents: [new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer)],
  });
const grpcError = async (call: Promise<unknown>) => {
  const err = await rejectionOf(call, ConnectError);
  return [Code[err.code], err.rawMessage];
};
const repositoryLoad = (name: string, body: unknown = {}) =>
  postJson(`${server.http}/v2/repository/models/${name}/load`, body);

describe("Triton parity: status codes", () => {
  it("infer on an unknown model or version: 404 / NOT_FOUND (server src/http_server.cc HandleInfer, PR #6713; core model_lifecycle.cc GetModel)", async () => {
    expect(await postJson(`${server.http}/v2/models/nope/infer`, echoBody)).toEqual({
      status: 404,
      json: { error: "Request for unknown model: 'nope' is not found" },
    });
    expect(await postJson(`${server.http}/v2/models/echo/versions/99/infer`, echoBody)).toEqual({
      status: 404,
      json: { error: "Request for unknown model: 'echo' version 99 is not found" },
    });
    expect(await grpcError(grpc.modelInfer(grpcEcho("nope")))).toEqual([
      "NotFound",
      "Request for unknown model: 'nope' is not found",
    ]);
    expect(await grpcError(grpc.modelInfer(grpcEcho("echo", "99")))).toEqual([
      "NotFound",
      "Request for unknown model: 'echo' version 99 is not found",
    ]);
  });

  it("the other routes on an unknown model: metadata and config 404, ready 404, stats 400 (server src/http_server.cc; core src/tritonserver.cc TRITONSERVER_ServerModelStatistics)", async () => {
    const unknown = { error: "Request for unknown model: 'nope' is not found" };
    for (const route of ["", "/config", "/ready"]) {
      const res = await fetch(`${server.http}/v2/models/nope${route}`);
      expect([route, res.status, await jsonOf(res)]).toEqual([route, 404, unknown]);
    }
    const stats = await fetch(`${server.http}/v2/models/nope/stats`);
    expect([stats.status, await jsonOf(stats)]).toEqual([400, { error: "requested model 'nope' is not available" }]);
    const version = await fetch(`${server.http}/v2/models/echo/versions/99/stats`);
    expect([version.status, await jsonOf(version)]).toEqual([
      400,
      { error: "requested model version is not available for model 'echo'" },
    ]);
    expect(await grpcError(grpc.modelMetadata({ name: "nope" }))).toEqual(["NotFound", unknown.error]);
    expect(await grpcError(grpc.modelConfig({ name: "nope" }))).toEqual(["NotFound", unknown.error]);
    expect(await grpcError(grpc.modelStatistics({ name: "nope" }))).toEqual([
      "InvalidArgument",
      "requested model 'nope' is not available",
    ]);
  });

  it("infer after unload: 404 / NOT_FOUND '... has no available versions' (core model_lifecycle.cc GetModel)", async () => {
    expect((await postJson(`${server.http}/v2/repository/models/other/unload`, {})).status).toBe(200);
    expect(await postJson(`${server.http}/v2/models/other/infer`, echoBody)).toEqual({
      status: 404,
      json: { error: "Request for unknown model: 'other' has no available versions" },
    });
    expect(await grpcError(grpc.modelInfer(grpcEcho("other")))).toEqual([
      "NotFound",
      "Request for unknown model: 'other' has no available versions",
    ]);
  });

  it("load of a model not in the repository, or of files without a config: 500 / INTERNAL 'failed to poll from model repository' (qa/L0_lifecycle/lifecycle_test.py)", async () => {
    const absent = await repositoryLoad("absent");
    expect(absent.status).toBe(500);
    expect(absent.json.error).toMatch(/^failed to load 'absent', failed to poll from model repository/);
    const absentOverGrpc = await grpcError(grpc.repositoryModelLoad({ modelName: "absent" }));
    expect(absentOverGrpc[0]).toBe("Internal");
    expect(absentOverGrpc[1]).toMatch(/^failed to load 'absent', failed to poll from model repository/);
    const files = await repositoryLoad("echo", { parameters: { "file:1/model.onnx": "AAAA" } });
    expect(files.status).toBe(500);
    expect(files.json.error).toMatch(/^failed to load 'echo', failed to poll from model repository/);
    const overGrpc = await grpcError(
      grpc.repositoryModelLoad({
        modelName: "echo",
        parameters: { "file:1/model.onnx": { parameterChoice: { case: "bytesParam", value: new Uint8Array(3) } } },
      }),
    );
    expect(overGrpc[0]).toBe("Internal");
    expect(overGrpc[1]).toMatch(/^failed to load 'echo', failed to poll from model repository/);
  });

  it("trace_file through the trace API: 501 / UNIMPLEMENTED (server src/http_server.cc, src/grpc/grpc_server.cc)", async () => {
    const message = /^trace file location can not be updated through network protocol/;
    for (const trace_file of ["x.json", null]) {
      const res = await postJson(`${server.http}/v2/trace/setting`, { trace_file });
      expect(res.status).toBe(501);
      expect(res.json.error).toMatch(message);
    }
    const overGrpc = await grpcError(grpc.traceSetting({ settings: { trace_file: { value: ["x.json"] } } }));
    expect(overGrpc[0]).toBe("Unimplemented");
    expect(overGrpc[1]).toMatch(message);
    // A model named with no settings still clears its own (trace_file is not among them).
    expect((await postJson(`${server.http}/v2/models/echo/trace/setting`, {})).status).toBe(200);
  });

  it("shared memory register or unregister while client shm is off: 501 / UNIMPLEMENTED (server src/http_server.cc, src/common.h kClientShmDisabledErrorStr)", async () => {
    const message = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";
    for (const kind of ["system", "cuda"]) {
      for (const path of ["unregister", "region/r0/unregister", "region/r0/register"]) {
        const res = await postJson(`${server.http}/v2/${kind}sharedmemory/${path}`, {
          key: "/r0",
          offset: 0,
          byte_size: 8,
        });
        expect([kind, path, res.status, res.json]).toEqual([kind, path, 501, { error: message }]);
      }
    }
    expect(await grpcError(grpc.systemSharedMemoryUnregister({}))).toEqual(["Unimplemented", message]);
    expect(await grpcError(grpc.systemSharedMemoryUnregister({ name: "r0" }))).toEqual(["Unimplemented", message]);
    expect(await grpcError(grpc.cudaSharedMemoryUnregister({}))).toEqual(["Unimplemented", message]);
    expect(await grpcError(grpc.systemSharedMemoryRegister({ name: "r0", key: "/r0", byteSize: 8n }))).toEqual([
      "Unimplemented",
      message,
    ]);
    // Status is answered: nothing is registered.
    expect((await fetch(`${server.http}/v2/systemsharedmemory/status`)).status).toBe(200);
  });

  it("restricted APIs: gRPC UNAVAILABLE 'This protocol is restricted' (src/grpc/grpc_server.cc), HTTP 403 'This API is restricted' (src/http_server.cc)", async () => {
    const overGrpc = await grpcError(grpc.logSettings({}));
    expect(overGrpc[0]).toBe("Unavailable");
    expect(overGrpc[1]).toMatch(/^This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'/);
    const grpcKey = { "triton-grpc-protocol-admin-key": "s3cret" };
    expect((await grpc.logSettings({}, { headers: grpcKey })).settings).toBeDefined();
    const overHttp = await fetch(`${server.http}/v2/logging`);
    expect(overHttp.status).toBe(403);
    expect((await jsonOf(overHttp)).error).toMatch(/^This API is restricted, expecting header 'admin-key'/);
  });
});

describe("Triton parity: server metadata extensions", () => {
  // core src/server.cc InferenceServer::InferenceServer (statistics, trace and logging built in).
  const TRITON_EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
  ];
  it("lists exactly Triton's extensions over HTTP and gRPC, client shm on or off", async () => {
    expect((await jsonOf(await fetch(`${server.http}/v2`))).extensions).toEqual(TRITON_EXTENSIONS);
    expect((await grpc.serverMetadata({})).extensions).toEqual(TRITON_EXTENSIONS);
  });
});

describe("Triton parity: classification on a BYTES output", () => {
  // server src/classification.cc TopkClassifications; qa/L0_parameters/class_count_test.py.
  const message = "class result not available for output due to unsupported type 'BYTES'";
  const logits = Array.from({ length: 1000 }, (_, i) => (i === 285 ? 9 : 0));
  it("is refused: 400 / INVALID_ARGUMENT naming the type", async () => {
    const res = await postJson(`${server.http}/v2/models/resnet50_postprocess/infer`, {
      inputs: [{ name: "LOGITS", datatype: "FP32", shape: [1, 1000], data: logits }],
      outputs: [{ name: "OUTPUT_RESULTS", parameters: { classification: 3 } }],
    });
    expect(res.status).toBe(400);
    expect(res.json.error).toContain(message);
    const err = await rejectionOf(
      grpc.modelInfer(
        create(ModelInferRequestSchema, {
          modelName: "resnet50_postprocess",
          inputs: [{ name: "LOGITS", datatype: "FP32", shape: [1n, 1000n] }],
          rawInputContents: [new Uint8Array(Float32Array.from(logits).buffer)],
          outputs: [
            {
              name: "OUTPUT_RESULTS",
              parameters: {
                classification: create(InferParameterSchema, { parameterChoice: { case: "int64Param", value: 3n } }),
              },
            },
          ],
        }),
      ),
      ConnectError,
    );
    expect(err.code).toBe(Code.InvalidArgument);
    expect(err.rawMessage).toContain(message);
    // Without classification the model answers.
    const plain = await postJson(`${server.http}/v2/models/resnet50_postprocess/infer`, {
      inputs: [{ name: "LOGITS", datatype: "FP32", shape: [1, 1000], data: logits }],
    });
    expect(plain.status).toBe(200);
  });
});
