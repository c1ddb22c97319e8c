/**
 * Unary ModelInfer over gRPC takes a direct path past Connect's handler
 * (grpc-model-infer.ts). These drive it with a raw HTTP/2 client (the
 * envelope errors a gRPC library never sends), @grpc/grpc-js (deadlines,
 * cancel) and Connect clients (compressed and gRPC-Web calls, which stay on
 * Connect's path), all on a real server on 127.0.0.1.
 */
import http2 from "node:http2";
import { create, toBinary } from "@bufbuild/protobuf";
import { Code, createClient } from "@connectrpc/connect";
import { compressionGzip, createGrpcTransport, createGrpcWebTransport } from "@connectrpc/connect-node";
import { stageRegistry } from "@trellis/kserve";
import { frameBytes } from "@trellis/kserve/wire";
import { GRPCInferenceService, ModelInferRequestSchema, parseModelConfig } from "@trellis/protocol";
import { defineStage } from "@trellis/stage";
import { grpcJsInferenceClient } from "@trellis/testing";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ListeningServer, listenStage } from "../src/grpc/serve.js";
import { echoStage } from "./echo-stage.js";

/** A stage that answers only when its call is aborted, and records why. */
function waitingStage() {
  const aborted: unknown[] = [];
  let started = 0;
  const stage = defineStage({
    config: parseModelConfig(
      'name: "wait" input { name: "IN" data_type: TYPE_FP32 dims: [1] } output { name: "OUT" data_type: TYPE_FP32 dims: [1] }',
    ),
    compute: (_req, options) =>
      new Promise((_resolve, reject) => {
        started++;
        options?.signal?.addEventListener("abort", () => {
          aborted.push(options.signal?.reason);
          reject(options.signal?.reason);
        });
      }),
  });
  return { stage, aborted, started: () => started };
}

const LIMIT = 4096;
let server: ListeningServer;
let waiting: ReturnType<typeof waitingStage>;

beforeAll(async () => {
  waiting = waitingStage();
  const echo = echoStage();
  // Answers 30 ms after it is called: long enough for a deadline that fires early to show.
  const slow = defineStage({
    config: parseModelConfig(
      'name: "slow" input { name: "IN" data_type: TYPE_FP32 dims: [1] } output { name: "IN" data_type: TYPE_FP32 dims: [1] }',
    ),
    compute: async (req) => {
      await new Promise((resolve) => setTimeout(resolve, 30));
      return req.inputs;
    },
  });
  server = await listenStage(
    {
      ...stageRegistry(echo),
      resolve: (name: string) => (name === "wait" ? waiting.stage : name === "slow" ? slow : echo),
      list: () => [echo, waiting.stage, slow],
    },
    { maxInputBytes: LIMIT },
  );
});
afterAll(async () => {
  await server.close();
});

const VALUES = new Float32Array([1, 2, 3]);
const echoRequest = () =>
  create(ModelInferRequestSchema, {
    modelName: "echo",
    id: "fast",
    inputs: [{ name: "VALUES", datatype: "FP32", shape: [1n, 3n] }],
    rawInputContents: [new Uint8Array(VALUES.buffer)],
  });

/** A call to the waiting (or another one-FP32-input) stage, serialized. */
const waitRequest = (modelName = "wait") =>
  toBinary(
    ModelInferRequestSchema,
    create(ModelInferRequestSchema, {
      modelName,
      inputs: [{ name: "IN", datatype: "FP32", shape: [1n, 1n] }],
      rawInputContents: [new Uint8Array(new Float32Array([1]).buffer)],
    }),
  );

function envelope(message: Uint8Array, flags = 0): Buffer {
  const out = Buffer.alloc(5 + message.length);
  out[0] = flags;
  out.writeUInt32BE(message.length, 1);
  out.set(message, 5);
  return out;
}

interface RawAnswer {
  status: number | undefined;
  contentType: string | undefined;
  body: Buffer;
  grpcStatus: string | undefined;
  grpcMessage: string | undefined;
}

/** One POST to ModelInfer with `body` as it is, over a fresh HTTP/2 session. */
function rawCall(body: Buffer, headers: http2.OutgoingHttpHeaders = {}): Promise<RawAnswer> {
  const session = http2.connect(server.url);
  return new Promise<RawAnswer>((resolve, reject) => {
    const stream = session.request({
      ":method": "POST",
      ":path": "/inference.GRPCInferenceService/ModelInfer",
      "content-type": "application/grpc",
      te: "trailers",
      ...headers,
    });
    const chunks: Buffer[] = [];
    let status: number | undefined;
    let contentType: string | undefined;
    let trailers: http2.IncomingHttpHeaders = {};
    stream.on("response", (h) => {
      status = h[":status"];
      contentType = h["content-type"];
    });
    stream.on("trailers", (t) => {
      trailers = t;
    });
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("error", reject);
    stream.on("close", () =>
      resolve({
        status,
        contentType,
        body: Buffer.concat(chunks),
        grpcStatus: trailers["grpc-status"] as string | undefined,
        grpcMessage: trailers["grpc-message"] ? decodeURIComponent(trailers["grpc-message"] as string) : undefined,
      }),
    );
    stream.end(body);
  }).finally(() => session.close());
}

describe("unary ModelInfer over gRPC, the direct path", () => {
  it("answers a well-formed call with one enveloped response and grpc-status 0", async () => {
    const answer = await rawCall(envelope(toBinary(ModelInferRequestSchema, echoRequest())));
    expect(answer.status).toBe(200);
    expect(answer.contentType).toBe("application/grpc+proto");
    expect(answer.grpcStatus).toBe("0");
    expect(answer.body[0]).toBe(0);
    expect(answer.body.readUInt32BE(1)).toBe(answer.body.length - 5);
  });

  it.each([
    ["an empty body", Buffer.alloc(0), Code.InvalidArgument, /missing input message/],
    ["a cut-off envelope header", Buffer.from([0, 0, 0]), Code.InvalidArgument, /incomplete envelope/],
    [
      "a message shorter than promised",
      envelope(new Uint8Array(10)).subarray(0, 9),
      Code.InvalidArgument,
      /promised 10 bytes, received 4/,
    ],
    [
      "two messages",
      Buffer.concat([envelope(toBinary(ModelInferRequestSchema, echoRequest())), envelope(new Uint8Array(1))]),
      Code.InvalidArgument,
      /extra input message/,
    ],
    [
      "a compressed flag without grpc-encoding",
      envelope(new Uint8Array(3), 1),
      Code.InvalidArgument,
      /compressed message without grpc-encoding/,
    ],
    [
      "bytes that are not a ModelInferRequest",
      envelope(new Uint8Array([0xff, 0xff, 0xff])),
      Code.InvalidArgument,
      /parse binary/,
    ],
  ])("refuses %s with INVALID_ARGUMENT naming the fault", async (_what, body, code, message) => {
    const answer = await rawCall(body);
    expect(answer.grpcStatus).toBe(String(code));
    expect(answer.grpcMessage).toMatch(message);
    expect(answer.body.length).toBe(0);
  });

  it("refuses a message whose envelope declares more than maxInputBytes, then serves the next call", async () => {
    // Only the header and a little of the body are sent: the refusal cannot wait for the rest.
    const head = Buffer.alloc(5 + 100);
    head.writeUInt32BE(10 * LIMIT, 1);
    const answer = await rawCall(head);
    expect(answer.grpcStatus).toBe(String(Code.ResourceExhausted));
    expect(answer.grpcMessage).toBe(
      `request message of ${10 * LIMIT} bytes exceeds the maximum allowed value of ${LIMIT} bytes`,
    );
    const next = await rawCall(envelope(toBinary(ModelInferRequestSchema, echoRequest())));
    expect(next.grpcStatus).toBe("0");
  });

  it("refuses a malformed grpc-timeout with INVALID_ARGUMENT", async () => {
    const answer = await rawCall(envelope(toBinary(ModelInferRequestSchema, echoRequest())), {
      "grpc-timeout": "soon",
    });
    expect(answer.grpcStatus).toBe(String(Code.InvalidArgument));
    expect(answer.grpcMessage).toMatch(/invalid grpc timeout value: soon/);
  });

  it("serves a call whose grpc-timeout is longer than a Node timer can hold (99999999 hours)", async () => {
    const answer = await rawCall(envelope(waitRequest("slow")), { "grpc-timeout": "99999999H" });
    expect(answer.grpcStatus).toBe("0");
  });

  it("answers DEADLINE_EXCEEDED at the client's deadline, aborts the stage's call, and serves the next", async () => {
    const before = waiting.aborted.length;
    const answer = await rawCall(envelope(waitRequest()), { "grpc-timeout": "100m" });
    expect(answer.grpcStatus).toBe(String(Code.DeadlineExceeded));
    expect(answer.grpcMessage).toMatch(/timed out/);
    expect(waiting.aborted.length).toBe(before + 1);
    expect((waiting.aborted.at(-1) as { code: Code }).code).toBe(Code.DeadlineExceeded);

    const client = grpcJsInferenceClient(`127.0.0.1:${server.port}`);
    try {
      const ok = await client.modelInfer({
        model_name: "echo",
        inputs: [{ name: "VALUES", datatype: "FP32", shape: [1, 3] }],
        raw_input_contents: [Buffer.from(VALUES.buffer)],
      });
      expect(new Float32Array(new Uint8Array(ok.raw_output_contents[0] as Buffer).buffer)).toEqual(VALUES);
    } finally {
      client.close();
    }
  });

  it("aborts the stage's call with CANCELED when the client cancels", async () => {
    const before = waiting.aborted.length;
    const startedBefore = waiting.started();
    const session = http2.connect(server.url);
    const stream = session.request({
      ":method": "POST",
      ":path": "/inference.GRPCInferenceService/ModelInfer",
      "content-type": "application/grpc",
    });
    stream.on("error", () => {});
    stream.end(envelope(waitRequest()));
    await expect.poll(() => waiting.started()).toBe(startedBefore + 1);
    stream.close(http2.constants.NGHTTP2_CANCEL);
    await expect.poll(() => waiting.aborted.length).toBe(before + 1);
    expect((waiting.aborted.at(-1) as { code: Code }).code).toBe(Code.Canceled);
    session.close();
  });

  it("leaves gzip-compressed calls and gRPC-Web calls to Connect, which answers them the same", async () => {
    const gzip = createClient(
      GRPCInferenceService,
      // Every message compressed, however small.
      createGrpcTransport({ baseUrl: server.url, compressMinBytes: 0, sendCompression: compressionGzip }),
    );
    const web = createClient(GRPCInferenceService, createGrpcWebTransport({ baseUrl: server.url, httpVersion: "2" }));
    const plain = createClient(GRPCInferenceService, createGrpcTransport({ baseUrl: server.url }));
    for (const client of [gzip, web, plain]) {
      const res = await client.modelInfer(echoRequest());
      expect(res.id).toBe("fast");
      expect(new Float32Array(new Uint8Array(res.rawOutputContents[0] as Uint8Array).slice().buffer)).toEqual(VALUES);
    }
    // Connect's path enforces the same limit, compressed or not.
    const big = create(ModelInferRequestSchema, {
      modelName: "echo",
      inputs: [{ name: "TEXT", datatype: "BYTES", shape: [1n, 1n] }],
      rawInputContents: [frameBytes([new Uint8Array(2 * LIMIT).fill(1)])],
    });
    for (const client of [gzip, web]) {
      await expect(client.modelInfer(big)).rejects.toMatchObject({ code: Code.ResourceExhausted });
    }
  });
});
