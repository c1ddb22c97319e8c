/**
 * Restricted APIs, as tritonserver's --http-restricted-api and
 * --grpc-restricted-protocol: endpoint groups that answer only requests
 * carrying a header with a set value.
 */
import { create } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport } from "@connectrpc/connect-node";
import { GRPCInferenceService, ModelInferRequestSchema } from "@trellis/protocol";
import {
  pythonGrpcCalls,
  pythonGrpcRequired,
  rejectionOf,
  removeDir,
  type ServerProcess,
  startServerProcess,
  startupRefusal,
} from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, explicitModels, grpcClientOf, jsonOf, makeRepository, postJson } from "./helpers.js";

let repo: string;
let server: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo") }, other: { config: echoConfig("other") } });
  server = await startServerProcess([
    ...explicitModels(repo, "echo"),
    "--http-restricted-api",
    "model-repository,logging:admin-key=s3cret",
    "--grpc-restricted-protocol",
    "model-repository:admin-key=s3cret",
  ]);
});
afterAll(async () => {
  expect(await server?.stop()).toBe(0);
  await removeDir(repo);
});

const DENIED_MESSAGE = "This API is restricted, expecting header 'admin-key' (the model-repository endpoints)";
/**
 * Triton's gRPC refusal, UNAVAILABLE (server src/grpc/grpc_server.cc); HTTP's is 403 (src/http_server.cc).
 * Over gRPC the key travels as the header triton-grpc-protocol-<key>, as Triton's docs configure a client.
 */
const GRPC_DENIED_MESSAGE =
  "This protocol is restricted, expecting header 'triton-grpc-protocol-admin-key' (the model-repository endpoints)";
const GRPC_KEY = { "triton-grpc-protocol-admin-key": "s3cret" };
const inferBody = { inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] };

describe("restricted APIs", () => {
  it("HTTP: 403 for a restricted group without the header or with a wrong value; served with it; the rest stays open", async () => {
    const index = (headers: Record<string, string>) =>
      fetch(`${server.http}/v2/repository/index`, { method: "POST", body: "{}", headers });
    const denied = await index({});
    expect(denied.status).toBe(403);
    expect(await jsonOf(denied)).toEqual({ error: DENIED_MESSAGE });
    expect((await index({ "admin-key": "guess" })).status).toBe(403);
    expect((await index({ "Admin-Key": "s3cret" })).status).toBe(200);
    expect((await fetch(`${server.http}/v2/logging`)).status).toBe(403);
    expect((await fetch(`${server.http}/v2/logging`, { headers: { "admin-key": "s3cret" } })).status).toBe(200);
    expect((await postJson(`${server.http}/v2/models/echo/infer`, inferBody)).status).toBe(200);
    expect((await fetch(`${server.http}/v2/health/ready`)).status).toBe(200);
    // gRPC-Web and Connect calls on the HTTP port come under the HTTP port's restrictions.
    const overHttp = createClient(
      GRPCInferenceService,
      createConnectTransport({ baseUrl: server.http, httpVersion: "1.1" }),
    );
    // They are gRPC methods: refused as Triton's gRPC refuses them.
    expect((await rejectionOf(overHttp.repositoryIndex({}), ConnectError)).code).toBe(Code.Unavailable);
  });

  it("gRPC: UNAVAILABLE without the header, as Triton, loads and unloads with it; inference stays open", async () => {
    const client = grpcClientOf(server);
    const denied = await rejectionOf(client.repositoryModelLoad({ modelName: "other" }), ConnectError);
    expect([denied.code, denied.rawMessage]).toEqual([Code.Unavailable, GRPC_DENIED_MESSAGE]);
    // The bare key, HTTP's header, is not what gRPC takes.
    const bare = await rejectionOf(
      client.repositoryModelLoad({ modelName: "other" }, { headers: { "admin-key": "s3cret" } }),
      ConnectError,
    );
    expect([bare.code, bare.rawMessage]).toEqual([Code.Unavailable, GRPC_DENIED_MESSAGE]);
    await client.repositoryModelLoad({ modelName: "other" }, { headers: GRPC_KEY });
    expect((await client.modelReady({ name: "other" })).ready).toBe(true);
    const res = await client.modelInfer(
      create(ModelInferRequestSchema, {
        modelName: "echo",
        inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
        rawInputContents: [new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer)],
      }),
    );
    expect(res.modelName).toBe("echo");
  });

  it.runIf(pythonGrpcRequired())(
    "gRPC from a C-core client: the header as call metadata, as tritonclient's headers= sends it",
    async () => {
      const address = `127.0.0.1:${server.grpcPort}`;
      const [without, withKey] = await pythonGrpcCalls(address, [
        { method: "RepositoryIndex", request: {} },
        { method: "RepositoryIndex", request: {}, metadata: GRPC_KEY },
      ]);
      expect(without?.error).toEqual({ code: "UNAVAILABLE", details: GRPC_DENIED_MESSAGE });
      expect(((withKey?.response?.models ?? []) as unknown[]).length).toBeGreaterThan(0);
    },
  );

  it("refuses to start with a restriction it cannot read, saying why", async () => {
    const bad = await startupRefusal(["--model-repository", repo, "--http-restricted-api", "models:k=v"]);
    expect(String(bad)).toContain("trellis-server: unknown restricted api 'models'");
    const twice = await startupRefusal([
      "--model-repository",
      repo,
      "--grpc-restricted-protocol",
      "health:a=1",
      "--grpc-restricted-protocol",
      "health,inference:b=2",
    ]);
    expect(String(twice)).toContain(
      "trellis-server: restricted protocol 'health' can not be specified in multiple config groups",
    );
  });
});
