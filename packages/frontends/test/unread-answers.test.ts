/** Issue 46 item 3: answers clients never read are bounded across all gRPC connections. */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { ModelInferRequestSchema, parseModelConfig } from "@trellis/protocol";
import { defineStage, tensor } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createGrpcServer, type GrpcServer } from "../src/grpc/serve.js";

const MiB = 1024 * 1024;
/** Each answer: 1 MiB of FP32, from a request of a few bytes (as preprocess answers an image). */
const amplifier = defineStage({
  config: parseModelConfig(`name: "amp" backend: "typescript" max_batch_size: 0
    input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
    output [ { name: "OUT", data_type: TYPE_FP32, dims: [ ${MiB / 4} ] } ]`),
  compute: () => [tensor("OUT", "FP32", [MiB / 4], new Float32Array(MiB / 4))],
});

const message = toBinary(
  ModelInferRequestSchema,
  create(ModelInferRequestSchema, {
    modelName: "amp",
    inputs: [{ name: "IN", datatype: "FP32", shape: [1n] }],
    rawInputContents: [new Uint8Array(new Float32Array([1]).buffer)],
  }),
);
const envelope = Buffer.concat([Buffer.from([0, 0, 0, 0, message.length]), message]);

let grpc: GrpcServer;
let url: string;
beforeAll(async () => {
  grpc = createGrpcServer(amplifier, { maxUnreadAnswerBytes: 3 * MiB });
  await new Promise<void>((resolve) => grpc.server.listen(0, "127.0.0.1", resolve));
  url = `http://127.0.0.1:${(grpc.server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  for (const s of grpc.sessions) s.destroy();
  await new Promise<void>((resolve) => grpc.server.close(() => resolve()));
});

/** A connection whose flow-control window is 0: the server may send it no answer bytes at all. */
function nonReader(): http2.ClientHttp2Session {
  const session = http2.connect(url, { settings: { initialWindowSize: 0 } });
  session.on("error", () => undefined);
  return session;
}

function call(session: http2.ClientHttp2Session): http2.ClientHttp2Stream {
  const stream = session.request({
    ":method": "POST",
    ":path": "/inference.GRPCInferenceService/ModelInfer",
    "content-type": "application/grpc",
    te: "trailers",
  });
  stream.on("error", () => undefined);
  stream.end(envelope);
  return stream;
}

/** A call read to its end: the answer's bytes and grpc-status. */
function readCall(session: http2.ClientHttp2Session): Promise<{ bytes: number; status: string | undefined }> {
  return new Promise((resolve, reject) => {
    const stream = call(session);
    let bytes = 0;
    stream.on("data", (chunk: Buffer) => {
      bytes += chunk.length;
    });
    stream.on("trailers", (t) => resolve({ bytes, status: t["grpc-status"] as string | undefined }));
    stream.on("close", () => reject(new Error("closed without trailers")));
  });
}

async function until(check: () => boolean): Promise<void> {
  while (!check()) await new Promise((r) => setTimeout(r, 10));
}

describe("unread gRPC answers", () => {
  it("resets the connection holding the most once all connections hold more than the bound; readers go on", async () => {
    const reader = http2.connect(url);
    const first = await readCall(reader);
    expect(first.status).toBe("0");
    expect(first.bytes).toBeGreaterThan(MiB);

    const small = nonReader();
    call(small);
    await until(() => grpc.unreadAnswers.held().total >= MiB);
    const big = nonReader();
    const bigClosed = new Promise<number | undefined>((resolve) => {
      big.once("goaway", (code: number) => resolve(code));
      big.once("close", () => resolve(undefined));
    });
    for (let i = 0; i < 3; i++) call(big);
    // Three answers on one connection and one on another: 4 MiB held, over the 3 MiB bound.
    expect(await bigClosed).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(grpc.unreadAnswers.resets).toBe(1);
    await until(() => grpc.sessions.size === 2);
    const held = grpc.unreadAnswers.held().total;
    expect(held).toBeGreaterThanOrEqual(MiB);
    expect(held).toBeLessThanOrEqual(3 * MiB);
    expect(small.closed || small.destroyed).toBe(false);

    // Held within the bound, one connection's answers never reset it; the reader is answered.
    for (let i = 0; i < 5; i++) expect((await readCall(reader)).status).toBe("0");
    expect(grpc.unreadAnswers.resets).toBe(1);
    small.destroy();
    reader.close();
  });
});
