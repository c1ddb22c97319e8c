/**
 * Parity, round 2b (issue 47): restricted protocols with the headers Triton's clients send, and
 * the server identity server metadata reports.
 *
 * Triton's docs (customization_guide/inference_protocols.md, "Restricted Protocols"): started
 * with --grpc-restricted-protocol=<protocols>:<key>=<value>, a gRPC call must carry the header
 * `triton-grpc-protocol-<key>: <value>`; started with --http-restricted-api=<apis>:<key>=<value>,
 * an HTTP request the header `<key>: <value>`. A client configured that way is tested here with
 * grpc-js (call metadata) and fetch.
 */
import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as grpc from "@grpc/grpc-js";
import {
  ModelInferRequestSchema,
  ModelInferResponseSchema,
  ServerMetadataRequestSchema,
  ServerMetadataResponseSchema,
  ServerReadyRequestSchema,
  ServerReadyResponseSchema,
} from "@trellis/protocol";
import { removeDir, type ServerProcess, startServerProcess } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { echoConfig, makeRepository } from "./helpers.js";

const SERVICE = "/inference.GRPCInferenceService";

/** One unary call with grpc-js, its metadata as given: resolves to the answer's bytes or the status error. */
function unary(
  client: grpc.Client,
  method: string,
  request: Uint8Array,
  metadata: Record<string, string>,
): Promise<Buffer | grpc.ServiceError> {
  const md = new grpc.Metadata();
  for (const [k, v] of Object.entries(metadata)) md.set(k, v);
  return new Promise((resolve) => {
    client.makeUnaryRequest(
      `${SERVICE}/${method}`,
      (b: Buffer) => b,
      (b: Buffer) => b,
      Buffer.from(request),
      md,
      (err, answer) => resolve(err ?? (answer as Buffer)),
    );
  });
}

const inferRequest = toBinary(
  ModelInferRequestSchema,
  create(ModelInferRequestSchema, {
    modelName: "echo",
    inputs: [{ name: "INPUT", datatype: "FP32", shape: [1n, 4n] }],
    rawInputContents: [new Uint8Array(Float32Array.from([1, 2, 3, 4]).buffer)],
  }),
);
const readyRequest = toBinary(ServerReadyRequestSchema, create(ServerReadyRequestSchema, {}));

let repo: string;
let restricted: ServerProcess;
let named: ServerProcess;
beforeAll(async () => {
  repo = await makeRepository({ echo: { config: echoConfig("echo") } });
  [restricted, named] = await Promise.all([
    startServerProcess([
      "--model-repository",
      repo,
      "--grpc-restricted-protocol",
      "inference,health:infer-key=infer-value",
      "--http-restricted-api",
      "inference:infer-key=infer-value",
    ]),
    startServerProcess(["--model-repository", repo, "--id", "my-triton", "--server-version", "2.61.0"]),
  ]);
}, 120_000);
afterAll(async () => {
  expect(await restricted?.stop()).toBe(0);
  expect(await named?.stop()).toBe(0);
  await removeDir(repo);
});

describe("restricted protocols, with the headers Triton's docs give a client", () => {
  it("gRPC (grpc-js): triton-grpc-protocol-<key> is served; the bare key or a wrong value is refused UNAVAILABLE", async () => {
    const client = new grpc.Client(`127.0.0.1:${restricted.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const ok = await unary(client, "ModelInfer", inferRequest, { "triton-grpc-protocol-infer-key": "infer-value" });
      expect(ok).toBeInstanceOf(Buffer);
      const out = fromBinary(ModelInferResponseSchema, ok as Buffer);
      expect(Array.from(new Float32Array(Uint8Array.from(out.rawOutputContents[0] ?? []).buffer))).toEqual([
        1, 2, 3, 4,
      ]);
      const ready = await unary(client, "ServerReady", readyRequest, {
        "triton-grpc-protocol-infer-key": "infer-value",
      });
      expect(fromBinary(ServerReadyResponseSchema, ready as Buffer).ready).toBe(true);
      const refused: Record<string, string>[] = [
        {},
        { "infer-key": "infer-value" },
        { "triton-grpc-protocol-infer-key": "guess" },
      ];
      for (const md of refused) {
        for (const [method, request] of [
          ["ModelInfer", inferRequest],
          ["ServerReady", readyRequest],
        ] as const) {
          const err = (await unary(client, method, request, md)) as grpc.ServiceError;
          expect(err.code).toBe(grpc.status.UNAVAILABLE);
          expect(err.details).toMatch(
            /^This protocol is restricted, expecting header 'triton-grpc-protocol-infer-key'/,
          );
        }
      }
      // Metadata stays open: it is not in the restricted groups.
      const meta = await unary(
        client,
        "ServerMetadata",
        toBinary(ServerMetadataRequestSchema, create(ServerMetadataRequestSchema, {})),
        {},
      );
      expect(meta).toBeInstanceOf(Buffer);
    } finally {
      client.close();
    }
  });

  it("HTTP: the header <key> as Triton names it, and nothing else", async () => {
    const infer = (headers: Record<string, string>) =>
      fetch(`${restricted.http}/v2/models/echo/infer`, {
        method: "POST",
        headers,
        body: JSON.stringify({ inputs: [{ name: "INPUT", datatype: "FP32", shape: [1, 4], data: [1, 2, 3, 4] }] }),
      });
    expect((await infer({ "infer-key": "infer-value" })).status).toBe(200);
    const refused: Record<string, string>[] = [
      {},
      { "triton-grpc-protocol-infer-key": "infer-value" },
      { "infer-key": "x" },
    ];
    for (const headers of refused) {
      const res = await infer(headers);
      expect(res.status).toBe(403);
      expect(((await res.json()) as { error: string }).error).toMatch(
        /^This API is restricted, expecting header 'infer-key'/,
      );
    }
  });
});

describe("server identity", () => {
  it("reports Triton's name by default, which Triton's example clients check, over HTTP and gRPC", async () => {
    const http = (await (await fetch(`${restricted.http}/v2`)).json()) as { name: string; version: string };
    expect(http.name).toBe("triton");
    const client = new grpc.Client(`127.0.0.1:${restricted.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const meta = await unary(
        client,
        "ServerMetadata",
        toBinary(ServerMetadataRequestSchema, create(ServerMetadataRequestSchema, {})),
        {},
      );
      expect(fromBinary(ServerMetadataResponseSchema, meta as Buffer).name).toBe("triton");
    } finally {
      client.close();
    }
  });

  it("reports the name and version given with --id and --server-version", async () => {
    const http = (await (await fetch(`${named.http}/v2`)).json()) as { name: string; version: string };
    expect([http.name, http.version]).toEqual(["my-triton", "2.61.0"]);
    const client = new grpc.Client(`127.0.0.1:${named.grpcPort}`, grpc.credentials.createInsecure());
    try {
      const meta = await unary(
        client,
        "ServerMetadata",
        toBinary(ServerMetadataRequestSchema, create(ServerMetadataRequestSchema, {})),
        {},
      );
      const md = fromBinary(ServerMetadataResponseSchema, meta as Buffer);
      expect([md.name, md.version]).toEqual(["my-triton", "2.61.0"]);
    } finally {
      client.close();
    }
  });
});
