import { readFileSync } from "node:fs";
import type http2 from "node:http2";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import * as grpc from "@grpc/grpc-js";
import { connectStage, grpcTransport } from "@trellis/kserve";
import { GRPCInferenceService } from "@trellis/protocol";
import type { InferRequest, Stage } from "@trellis/stage";
import { bytesTensor, Code, StageError, type Tensor } from "@trellis/stage";
import { grpcJsInferenceClient, rejectionOf, TLS_CERT_PATH, TLS_KEY_PATH } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { encodeGrpcMessage } from "../src/grpc/model-infer.js";
import { type ListeningServer, listenStage } from "../src/grpc/serve.js";
import { inMemoryTransport } from "../src/index.js";
import { parseRestriction } from "../src/restrictions.js";
import { echoStage } from "./echo-stage.js";

const TEXT = [new Uint8Array(0), new Uint8Array([0, 1, 0, 255, 0]), new TextEncoder().encode("tabby")];
const VALUES = new Float32Array([1.5, -2, 0, 3.25, Number.POSITIVE_INFINITY, -0]);

function request(): InferRequest {
  return {
    id: "req-1",
    inputs: [
      bytesTensor("TEXT", [3, 1], TEXT),
      { name: "VALUES", datatype: "FP32", shape: [3, 2], data: VALUES } as Tensor,
    ],
  };
}

let server: ListeningServer;
beforeAll(async () => {
  server = await listenStage(echoStage());
});
afterAll(async () => {
  await server.close();
});

describe("serveStage over real HTTP/2 gRPC on 127.0.0.1", () => {
  it("ends the HTTP/2 connection when a grpcTransport is closed", async () => {
    const own = await listenStage(echoStage());
    try {
      const open = new Set<http2.ServerHttp2Session>();
      own.server.on("session", (s) => {
        open.add(s);
        s.on("close", () => open.delete(s));
      });
      const transport = grpcTransport(own.url);
      const remote = await connectStage(transport, "echo");
      await remote.infer(request());
      const [session] = [...open];
      expect(open.size).toBe(1);
      const ended = new Promise((resolve) => session?.once("close", resolve));
      transport.close();
      await ended;
      expect(open.size).toBe(0);
    } finally {
      await own.close();
    }
  });

  it("refuses a message over maxInputBytes with RESOURCE_EXHAUSTED and serves the next one", async () => {
    const own = await listenStage(echoStage(), { maxInputBytes: 2000 });
    const transport = grpcTransport(own.url);
    try {
      const remote = await connectStage(transport, "echo");
      const big: InferRequest = { inputs: [bytesTensor("TEXT", [1, 1], [new Uint8Array(5000)])] };
      const err = await rejectionOf(remote.infer(big), StageError);
      expect(err.code).toBe(Code.ResourceExhausted);
      expect(err.message).toMatch(/request message of \d+ bytes exceeds the maximum allowed value of 2000 bytes/);
      const res = await remote.infer(request());
      expect(res.outputs[1]?.data).toEqual(VALUES);
    } finally {
      transport.close();
      await own.close();
    }
  });

  it("answers ModelInfer through our Connect client, tensors intact", async () => {
    const remote = await connectStage(grpcTransport(server.url), "echo");
    const res = await remote.infer(request());
    expect(res.id).toBe("req-1");
    expect(res.outputs.map((o) => o.name)).toEqual(["OUT_TEXT", "OUT_VALUES"]);
    expect(res.outputs[0]?.datatype).toBe("BYTES");
    expect(res.outputs[0]?.shape).toEqual([3, 1]);
    expect(res.outputs[0]?.data).toEqual(TEXT);
    expect(res.outputs[1]?.data).toEqual(VALUES);
  });

  it("answers ModelInfer from @grpc/grpc-js with the proto loaded at runtime, same tensors", async () => {
    const client = grpcJsInferenceClient(`127.0.0.1:${server.port}`);
    // Framed by hand, as a foreign client would: 4-byte LE length + bytes.
    const frame = (items: Uint8Array[]) =>
      Buffer.concat(
        items.flatMap((b) => {
          const len = Buffer.alloc(4);
          len.writeUInt32LE(b.byteLength);
          return [len, Buffer.from(b)];
        }),
      );
    const res = await client.modelInfer({
      model_name: "echo",
      id: "grpc-js",
      inputs: [
        { name: "TEXT", datatype: "BYTES", shape: [3, 1] },
        { name: "VALUES", datatype: "FP32", shape: [3, 2] },
      ],
      raw_input_contents: [frame(TEXT), Buffer.from(VALUES.buffer)],
    });
    expect(res.id).toBe("grpc-js");
    const outputs = res.outputs as { name: string; datatype: string; shape: number[] }[];
    expect(outputs.map((o) => [o.name, o.datatype, o.shape])).toEqual([
      ["OUT_TEXT", "BYTES", [3, 1]],
      ["OUT_VALUES", "FP32", [3, 2]],
    ]);
    const raw = res.raw_output_contents as Buffer[];
    expect(Buffer.compare(raw[0] as Buffer, frame(TEXT))).toBe(0);
    expect(new Float32Array(new Uint8Array(raw[1] as Buffer).buffer)).toEqual(VALUES);

    const live = await client.serverLive();
    expect(live.live).toBe(true);
    const meta = await client.modelMetadata({ name: "echo" });
    expect((meta.inputs as { name: string; shape: number[] }[])[1]).toMatchObject({ name: "VALUES", shape: [-1, -1] });

    const failure = await client.modelInfer({ model_name: "nope", inputs: [] }).catch((e: grpc.ServiceError) => e);
    expect((failure as grpc.ServiceError).code).toBe(grpc.status.NOT_FOUND);
    expect((failure as grpc.ServiceError).details).toContain('unknown model "nope"');
    client.close();
  });

  it("gives grpc-js error messages as written, on ModelInfer's direct path and Connect's (grpc-message as the spec encodes it)", async () => {
    const client = grpcJsInferenceClient(`127.0.0.1:${server.port}`);
    const name = "a:b,c/d% é";
    const direct = await client.modelInfer({ model_name: name, inputs: [] }).catch((e: grpc.ServiceError) => e);
    expect((direct as grpc.ServiceError).details).toBe(`unknown model "${name}"`);
    const viaConnect = await client.modelMetadata({ name }).catch((e: grpc.ServiceError) => e);
    expect((viaConnect as grpc.ServiceError).details).toBe(`unknown model "${name}"`);
    client.close();
    expect(encodeGrpcMessage(`x: 100%, é`)).toBe("x: 100%25, %C3%A9");
    expect(decodeURIComponent(encodeGrpcMessage(name))).toBe(name);
  });

  it("keeps the error code and the stage name across the wire", async () => {
    const remote = await connectStage(grpcTransport(server.url), "echo", { remoteLabel: server.url });
    const err = await remote.infer({ ...request(), parameters: { fail: "on purpose" } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(StageError);
    expect((err as StageError).code).toBe(Code.InvalidArgument);
    expect((err as StageError).rawMessage).toBe(
      `echo: remote model echo at ${server.url}: echo: asked to fail: on purpose`,
    );
  });

  it("keeps a StageError subclass's code over gRPC, gRPC-Web and the Connect protocol", async () => {
    const transports = {
      grpc: grpcTransport(server.url),
      grpcWeb: createGrpcWebTransport({ baseUrl: server.url, httpVersion: "2" }),
      connect: createConnectTransport({ baseUrl: server.url, httpVersion: "2" }),
    };
    for (const [name, transport] of Object.entries(transports)) {
      const remote = await connectStage(transport, "echo");
      const err = await rejectionOf(
        remote.infer({ ...request(), parameters: { fail: "x", failWith: "subclass" } }),
        StageError,
      );
      expect([name, err.code, err.rawMessage]).toEqual([
        name,
        Code.InvalidArgument,
        "echo: remote model echo: echo: asked to fail: x",
      ]);
    }
  });

  it("rejects malformed raw contents with INVALID_ARGUMENT before the stage runs", async () => {
    const remote = await connectStage(grpcTransport(server.url), "echo");
    const bad = request();
    bad.inputs[1] = { name: "VALUES", datatype: "FP32", shape: [3, 3], data: VALUES } as Tensor;
    const err = (await remote.infer(bad).catch((e: unknown) => e)) as StageError;
    expect(err.code).toBe(Code.InvalidArgument);
    // Triton's words (core src/infer_request.cc, Normalize).
    expect(err.rawMessage).toContain(
      "input byte size mismatch for input 'VALUES' for model 'echo'. Expected 36, got 24",
    );
  });

  it("answers LogSettings UNIMPLEMENTED when served without log settings (a stage alone)", async () => {
    const client = createClient(GRPCInferenceService, grpcTransport(server.url));
    const err = await rejectionOf(client.logSettings({}), ConnectError);
    expect([err.code, err.rawMessage]).toEqual([Code.Unimplemented, "log settings are not available on this server"]);
  });

  it("reports statistics that count the requests served", async () => {
    const remote = await connectStage(grpcTransport(server.url), "echo");
    const before = await remote.statistics();
    await remote.infer(request());
    await remote.infer(request());
    const after = await remote.statistics();
    expect(after.inferenceCount - before.inferenceCount).toBe(6n);
    expect(after.executionCount - before.executionCount).toBe(2n);
    expect((after.inferenceStats?.success?.count ?? 0n) - (before.inferenceStats?.success?.count ?? 0n)).toBe(2n);
  });
});

describe("serveStage over TLS", () => {
  const cert = readFileSync(TLS_CERT_PATH);
  const key = readFileSync(TLS_KEY_PATH);

  it("serves gRPC over TLS to a client that trusts the CA, and refuses one that does not", async () => {
    const own = await listenStage(echoStage(), { tls: { cert, key } });
    try {
      expect(own.url).toMatch(/^https:\/\/127\.0\.0\.1:\d+$/);
      const remote = await connectStage(grpcTransport(own.url, { tls: { ca: cert } }), "echo");
      const res = await remote.infer(request());
      expect(res.outputs.map((t) => t.name)).toEqual(["OUT_TEXT", "OUT_VALUES"]);
      const untrusted = await rejectionOf(connectStage(grpcTransport(own.url), "echo"), ConnectError);
      expect(untrusted.message).toMatch(/certificate/i);
    } finally {
      await own.close();
    }
  });

  it("with requireClientCert, serves only clients presenting a certificate that chains to its CA", async () => {
    const own = await listenStage(echoStage(), { tls: { cert, key, ca: cert, requireClientCert: true } });
    try {
      const withCert = await connectStage(grpcTransport(own.url, { tls: { ca: cert, cert, key } }), "echo");
      expect((await withCert.infer(request())).outputs).toHaveLength(2);
      const without = await rejectionOf(
        connectStage(grpcTransport(own.url, { tls: { ca: cert } }), "echo").then((s) => s.infer(request())),
        ConnectError,
      );
      expect(without.message).toMatch(/certificate required/);
    } finally {
      await own.close();
    }
  });
});

describe("restricted APIs on the gRPC port", () => {
  it("refuses restricted calls without the header on both ModelInfer's direct path and Connect's, and serves them with it", async () => {
    const own = await listenStage(echoStage(), {
      restrictions: parseRestriction("inference,metadata:api-key=k1"),
    });
    try {
      const client = createClient(GRPCInferenceService, grpcTransport(own.url));
      const denied = await rejectionOf(connectStage(grpcTransport(own.url), "echo"), ConnectError);
      // Triton's gRPC refusal: UNAVAILABLE "This protocol is restricted" (server src/grpc/grpc_server.cc).
      expect(denied.code).toBe(Code.Unavailable);
      expect((await client.serverLive({})).live).toBe(true); // health is open
      const withKey = grpcTransport(own.url, { headers: { "api-key": "k1" } });
      const remote = await connectStage(withKey, "echo");
      expect((await remote.infer(request())).outputs).toHaveLength(2);
      // ModelInfer's direct path: a grpc-js call without the key.
      const grpcJs = grpcJsInferenceClient(`127.0.0.1:${own.port}`);
      const failure = await grpcJs.modelInfer({ model_name: "echo", inputs: [] }).catch((e: grpc.ServiceError) => e);
      expect((failure as grpc.ServiceError).code).toBe(grpc.status.UNAVAILABLE);
      expect((failure as grpc.ServiceError).details).toBe(
        "This protocol is restricted, expecting header 'api-key' (the inference endpoints)",
      );
      grpcJs.close();
    } finally {
      await own.close();
    }
  });
});

describe("in-memory transport", () => {
  it("is used exactly like a remote stage", async () => {
    const local: Stage = echoStage();
    const viaMemory = await connectStage(inMemoryTransport(local), "echo");
    const direct = await local.infer(request());
    const remote = await viaMemory.infer(request());
    expect(remote.outputs.map((o) => o.data)).toEqual(direct.outputs.map((o) => o.data));
    expect(await viaMemory.isReady()).toBe(true);
    expect(viaMemory.config.name).toBe("echo");
  });
});
