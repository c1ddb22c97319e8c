/**
 * The server as Triton's own clients see it: grpcio (the C-core gRPC library
 * under tritonclient.grpc, sharing no code with grpc-js or Connect) makes the
 * calls tritonclient makes, on the seed repository with the shared MobileNetV2.
 */
import { create, fromJson, type JsonObject, toJson } from "@bufbuild/protobuf";
import { frameBytes, tensorFromRaw } from "@trellis/kserve/wire";
import {
  type ModelInferRequest,
  ModelInferRequestSchema,
  type ModelInferResponse,
  ModelInferResponseSchema,
} from "@trellis/protocol";
import {
  makeSeedRepository,
  type PythonGrpcCall,
  pythonGrpcCalls,
  pythonGrpcRequired,
  readFixtureImage,
  referenceTop5OnThisCpu,
  removeDir,
  type ServerProcess,
  startServerProcess,
  TRUNCATED_PHOTO,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, explicitModels, grpcClientOf, makeRepository } from "./helpers.js";

/** ONNX Runtime run directly on the seed's reference tensors on this CPU (the int8 model's kernels differ between CPUs). */
const references = await referenceTop5OnThisCpu();
const photos = Object.keys(references).sort();
const decoder = new TextDecoder();

let repo: string;
let server: ServerProcess;

const ensembleRequest = (images: Uint8Array[], id = ""): ModelInferRequest =>
  create(ModelInferRequestSchema, {
    modelName: "resnet50_ensemble",
    id,
    inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: [BigInt(images.length), 1n] }],
    rawInputContents: [frameBytes(images)],
  });

const infer = (request: ModelInferRequest, extra: Partial<PythonGrpcCall> = {}): PythonGrpcCall => ({
  method: "ModelInfer",
  request: toJson(ModelInferRequestSchema, request),
  ...extra,
});

const inferResponse = (json: JsonObject | undefined): ModelInferResponse =>
  fromJson(ModelInferResponseSchema, json ?? null);

/** The OUTPUT_RESULTS strings of an ensemble response, read with our own BYTES codec. */
function answers(res: ModelInferResponse): string[] {
  const [output] = res.outputs;
  const tensor = tensorFromRaw(
    "output",
    { name: output?.name ?? "", datatype: output?.datatype ?? "", shape: (output?.shape ?? []).map(Number) },
    res.rawOutputContents[0] as Uint8Array,
  );
  return (tensor.data as Uint8Array[]).map((b) => decoder.decode(b));
}

const top1 = (answer: string) => (JSON.parse(answer) as { top5_labels: string[] }).top5_labels[0];

describe.runIf(pythonGrpcRequired())("a C-core gRPC client (grpcio, as tritonclient.grpc)", () => {
  let address: string;
  beforeAll(async () => {
    repo = await makeSeedRepository();
    server = await startServerProcess(["--model-repository", repo]);
    address = `127.0.0.1:${server.grpcPort}`;
  });
  afterAll(async () => {
    expect(await server?.stop()).toBe(0);
    await removeDir(repo);
  });

  it("reads health, server and model metadata, config and the repository index", async () => {
    const [live, ready, meta, modelReady, modelMeta, config, index] = await pythonGrpcCalls(address, [
      { method: "ServerLive" },
      { method: "ServerReady" },
      { method: "ServerMetadata" },
      { method: "ModelReady", request: { name: "resnet50_ensemble" } },
      { method: "ModelMetadata", request: { name: "resnet50_ensemble" } },
      { method: "ModelConfig", request: { name: "resnet50_inference" } },
      { method: "RepositoryIndex", request: { ready: true } },
    ]);
    expect(live?.response).toEqual({ live: true });
    expect(ready?.response).toEqual({ ready: true });
    // Triton's list, always (core src/server.cc), with sequence and both shared memories.
    expect(meta?.response?.extensions).toEqual(
      expect.arrayContaining(["classification", "sequence", "cuda_shared_memory"]),
    );
    expect(modelReady?.response).toEqual({ ready: true });
    expect(modelMeta?.response).toMatchObject({
      name: "resnet50_ensemble",
      platform: "ensemble",
      inputs: [{ name: "RAW_IMAGE", datatype: "BYTES", shape: ["-1", "1"] }],
      outputs: [{ name: "OUTPUT_RESULTS", datatype: "BYTES", shape: ["-1", "1"] }],
    });
    expect(config?.response?.config).toMatchObject({ name: "resnet50_inference", maxBatchSize: expect.any(Number) });
    const names = ((index?.response?.models ?? []) as { name: string; state: string }[]).map(
      (m) => `${m.name} ${m.state}`,
    );
    expect(names.sort()).toEqual(
      ["resnet50_ensemble", "resnet50_inference", "resnet50_postprocess", "resnet50_preprocess"].map(
        (m) => `${m} READY`,
      ),
    );
  });

  it("classifies every photo in one batched request as the reference does, plain, gzip or deflate, byte for byte as the Connect client", async () => {
    const images = photos.map((p) => readFixtureImage(p));
    const [plain, gzip, deflate] = await pythonGrpcCalls(address, [
      infer(ensembleRequest(images, "batch-1")),
      infer(ensembleRequest(images, "batch-2"), { compression: "gzip" }),
      infer(ensembleRequest(images, "batch-3"), { compression: "deflate" }),
    ]);
    expect(plain?.error).toBeUndefined();
    const res = inferResponse(plain?.response);
    expect(res.id).toBe("batch-1");
    expect(res.outputs[0]).toMatchObject({
      name: "OUTPUT_RESULTS",
      datatype: "BYTES",
      shape: [BigInt(photos.length), 1n],
    });
    expect(answers(res).map(top1)).toEqual(photos.map((p) => references[p]?.top5_labels[0]));
    // Compressed requests (tritonclient.grpc's compression_algorithm: gzip or deflate, both of
    // which Triton takes; Connect's handler decompresses them) answer the same.
    expect(answers(inferResponse(gzip?.response))).toEqual(answers(res));
    expect(deflate?.error).toBeUndefined();
    expect(answers(inferResponse(deflate?.response))).toEqual(answers(res));

    const client = grpcClientOf(server);
    expect(answers(await client.modelInfer(ensembleRequest(images)))).toEqual(answers(res));
  });

  it("streams requests through ModelStreamInfer, a bad one answered as its error (with its id) without ending the stream", async () => {
    const [stream] = await pythonGrpcCalls(address, [
      {
        method: "ModelStreamInfer",
        requests: [
          toJson(ModelInferRequestSchema, ensembleRequest([readFixtureImage("chelsea.jpg")], "a")),
          toJson(ModelInferRequestSchema, ensembleRequest([readFixtureImage(TRUNCATED_PHOTO)], "b")),
          toJson(ModelInferRequestSchema, ensembleRequest([readFixtureImage("coffee.jpg")], "c")),
        ],
      },
    ]);
    expect(stream?.error).toBeUndefined();
    // Answered in completion order, as Triton does: matched by id.
    const byId = new Map(
      (stream?.responses ?? []).map((r) => [
        inferResponse(r.inferResponse as JsonObject).id,
        { error: r.errorMessage as string | undefined, res: inferResponse(r.inferResponse as JsonObject) },
      ]),
    );
    expect([...byId.keys()].sort()).toEqual(["a", "b", "c"]);
    expect(byId.get("a")?.error).toBeUndefined();
    expect(answers(byId.get("a")?.res as ModelInferResponse).map(top1)).toEqual(["Egyptian cat"]);
    expect(byId.get("b")?.error).toMatch(
      /^resnet50_ensemble: step 0 resnet50_preprocess: INVALID_ARGUMENT: input RAW_IMAGE element 0: truncated or corrupt jpeg/,
    );
    expect(answers(byId.get("c")?.res as ModelInferResponse).map(top1)).toEqual(["espresso"]);
  });

  it("gets Triton's codes and messages for bad requests and an expired deadline, and the next call is served", async () => {
    const chelsea = readFixtureImage("chelsea.jpg");
    const wrongInput = ensembleRequest([chelsea]);
    (wrongInput.inputs[0] as { name: string }).name = "IMAGE";
    const photosBatch = photos.map((p) => readFixtureImage(p));
    const [unknown, badInput, badImage, late, next] = await pythonGrpcCalls(address, [
      infer({ ...ensembleRequest([chelsea]), modelName: "nope" }),
      infer(wrongInput),
      infer(ensembleRequest([chelsea, readFixtureImage(TRUNCATED_PHOTO)])),
      infer(ensembleRequest(photosBatch), { timeout: 0.005 }),
      infer(ensembleRequest([chelsea])),
    ]);
    expect(unknown?.error).toEqual({
      code: "NOT_FOUND",
      details: expect.stringContaining("Request for unknown model: 'nope' is not found"),
    });
    expect(badInput?.error?.code).toBe("INVALID_ARGUMENT");
    expect(badInput?.error?.details).toMatch(/IMAGE/);
    expect(badImage?.error?.code).toBe("INVALID_ARGUMENT");
    expect(badImage?.error?.details).toMatch(/RAW_IMAGE element 1: truncated or corrupt jpeg/);
    expect(late?.error?.code).toBe("DEADLINE_EXCEEDED");
    expect(answers(inferResponse(next?.response)).map(top1)).toEqual(["Egyptian cat"]);
  });
});

describe.runIf(pythonGrpcRequired())("Triton's status codes to a C-core gRPC client (grpcio)", () => {
  let repository: string;
  let explicit: ServerProcess;
  beforeAll(async () => {
    repository = await makeRepository({ echo: { config: echoConfig("echo") } });
    explicit = await startServerProcess([
      ...explicitModels(repository, "echo"),
      "--grpc-restricted-protocol",
      "model-repository:admin-key=s3cret",
    ]);
  });
  afterAll(async () => {
    expect(await explicit?.stop()).toBe(0);
    await removeDir(repository);
  });

  it("unknown model, restricted call, infer after unload, load of an absent model: as Triton's (see parity-codes.test.ts)", async () => {
    const echo = (modelName: string) =>
      infer(
        create(ModelInferRequestSchema, {
          modelName,
          inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
          rawInputContents: [new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer)],
        }),
      );
    // Triton's docs: over gRPC the key travels as triton-grpc-protocol-<key>.
    const key = { "triton-grpc-protocol-admin-key": "s3cret" };
    const [unknown, served, restricted, unloaded, afterUnload, absent] = await pythonGrpcCalls(
      `127.0.0.1:${explicit.grpcPort}`,
      [
        echo("nope"),
        echo("echo"),
        { method: "RepositoryModelUnload", request: { modelName: "echo" } },
        { method: "RepositoryModelUnload", request: { modelName: "echo" }, metadata: key },
        echo("echo"),
        { method: "RepositoryModelLoad", request: { modelName: "absent" }, metadata: key },
      ],
    );
    // core src/model_repository_manager/model_lifecycle.cc GetModel.
    expect(unknown?.error).toEqual({ code: "NOT_FOUND", details: "Request for unknown model: 'nope' is not found" });
    expect(served?.error).toBeUndefined();
    // server src/grpc/grpc_server.cc: UNAVAILABLE, not PERMISSION_DENIED.
    expect(restricted?.error?.code).toBe("UNAVAILABLE");
    expect(restricted?.error?.details).toMatch(
      /^This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key'/,
    );
    expect(unloaded?.error).toBeUndefined();
    expect(afterUnload?.error).toEqual({
      code: "NOT_FOUND",
      details: "Request for unknown model: 'echo' has no available versions",
    });
    // qa/L0_lifecycle/lifecycle_test.py: "failed to load 'unknown_model', failed to poll from model repository".
    expect(absent?.error?.code).toBe("INTERNAL");
    expect(absent?.error?.details).toMatch(/^failed to load 'absent', failed to poll from model repository/);
  });
});
