/**
 * Issue 46 item 3: answers clients never read are bounded across all gRPC connections.
 * Issue 52 item 6: the bound cuts connections that leave answers unread, never one that reads.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, toBinary } from "@bufbuild/protobuf";
import { ModelInferRequestSchema, parseModelConfig } from "@trellis/protocol";
import { defineStage, tensor } from "@trellis/stage";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createGrpcServer, type GrpcServer } from "../src/grpc/serve.js";

const MiB = 1024 * 1024;
/** Each answer: IN MiB of FP32, from a request of a few bytes (as preprocess answers an image). */
const amplifier = defineStage({
  config: parseModelConfig(`name: "amp" backend: "typescript" max_batch_size: 0
    input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
    output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]`),
  compute: (request) => {
    const mib = (request.inputs[0]?.data as Float32Array | undefined)?.[0] ?? 1;
    const floats = mib * (MiB / 4);
    return [tensor("OUT", "FP32", [floats], new Float32Array(floats))];
  },
});

/** A ModelInfer call's gRPC message, asking for an answer of `mib` MiB. */
function envelopeOf(mib: number): Buffer {
  const message = toBinary(
    ModelInferRequestSchema,
    create(ModelInferRequestSchema, {
      modelName: "amp",
      inputs: [{ name: "IN", datatype: "FP32", shape: [1n] }],
      rawInputContents: [new Uint8Array(new Float32Array([mib]).buffer)],
    }),
  );
  return Buffer.concat([Buffer.from([0, 0, 0, 0, message.length]), message]);
}
const envelope = envelopeOf(1);

/** A server on loopback whose unread answers may total `limit` bytes. */
async function serve(limit: number): Promise<{ grpc: GrpcServer; url: string }> {
  const server = createGrpcServer(amplifier, { maxUnreadAnswerBytes: limit });
  await new Promise<void>((resolve) => server.server.listen(0, "127.0.0.1", resolve));
  return { grpc: server, url: `http://127.0.0.1:${(server.server.address() as AddressInfo).port}` };
}
async function close(server: GrpcServer): Promise<void> {
  for (const s of server.sessions) s.destroy();
  await new Promise<void>((resolve) => server.server.close(() => resolve()));
}

let grpc: GrpcServer;
let url: string;
let fair: { grpc: GrpcServer; url: string };
beforeAll(async () => {
  ({ grpc, url } = await serve(3 * MiB));
  fair = await serve(12 * MiB);
});
afterAll(async () => {
  await close(grpc);
  await close(fair.grpc);
});

/** A connection whose flow-control window is 0: the server may send it no answer bytes at all. */
function nonReader(to = url): http2.ClientHttp2Session {
  const session = http2.connect(to, { settings: { initialWindowSize: 0 } });
  session.on("error", () => undefined);
  return session;
}

function call(session: http2.ClientHttp2Session, body = envelope): http2.ClientHttp2Stream {
  const stream = session.request({
    ":method": "POST",
    ":path": "/inference.GRPCInferenceService/ModelInfer",
    "content-type": "application/grpc",
    te: "trailers",
  });
  stream.on("error", () => undefined);
  stream.end(body);
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

    const big = nonReader();
    const bigClosed = new Promise<number | undefined>((resolve) => {
      big.once("goaway", (code: number) => resolve(code));
      big.once("close", () => resolve(undefined));
    });
    for (let i = 0; i < 3; i++) call(big);
    await until(() => grpc.unreadAnswers.held().total >= 2 * MiB);
    // Past the idle grace (1 s), so the big one is a candidate whenever the bound is crossed,
    // and the small one, newer, is not yet: which is cut does not hang on timer ticks.
    await new Promise((r) => setTimeout(r, 1200));
    const small = nonReader();
    call(small);
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

/** How a connection ended: the GOAWAY code it was sent, if any. */
function goawayOf(session: http2.ClientHttp2Session): { code: number | undefined } {
  const seen: { code: number | undefined } = { code: undefined };
  session.on("goaway", (code: number) => {
    seen.code = code;
  });
  return seen;
}

/**
 * A call read at a steady pace: 256 KiB, then a pause of 25 ms, and so on (a client that
 * processes what it reads); its answer's bytes and grpc-status.
 */
function readPaced(session: http2.ClientHttp2Session, body: Buffer) {
  return new Promise<{ bytes: number; status: string | undefined }>((resolve, reject) => {
    const stream = call(session, body);
    let bytes = 0;
    let sinceResume = 0;
    stream.on("data", (chunk: Buffer) => {
      bytes += chunk.length;
      sinceResume += chunk.length;
      if (sinceResume < 256 * 1024) return;
      sinceResume = 0;
      stream.pause();
      setTimeout(() => stream.resume(), 25);
    });
    // The trailers come as soon as they arrive; the answer is read once the stream ends.
    let status: string | undefined;
    stream.on("trailers", (t) => {
      status = t["grpc-status"] as string | undefined;
    });
    stream.on("end", () => resolve({ bytes, status }));
    stream.on("close", () => reject(new Error("closed before its end")));
  });
}

describe("who the bound cuts", () => {
  it("8 connections that never read are cut, not the client reading one large answer", async () => {
    const { grpc: server, url: to } = fair;
    const idle = Array.from({ length: 8 }, () => nonReader(to));
    const idleEnds = idle.map(goawayOf);
    for (const session of idle) call(session);
    // 8 MiB held, within the 12 MiB bound: nobody is cut, however long it sits.
    await until(() => server.unreadAnswers.held().total >= 8 * MiB);
    await new Promise((r) => setTimeout(r, 1200));
    expect(server.unreadAnswers.resets).toBe(0);

    // The honest client asks for 8 MiB and reads it at its pace: 16 MiB held, over the bound,
    // and it holds the most of any connection until it has read half of its answer.
    const honest = http2.connect(to, { settings: { initialWindowSize: 256 * 1024 } });
    const honestEnd = goawayOf(honest);
    const answer = await readPaced(honest, envelopeOf(8));
    expect(answer).toEqual({ bytes: expect.any(Number), status: "0" });
    expect(answer.bytes).toBeGreaterThanOrEqual(8 * MiB);
    expect(honestEnd.code).toBeUndefined();
    expect(honest.closed || honest.destroyed).toBe(false);

    // Idle connections were cut, each told why, and only as many as put the total over the bound.
    const cut = idleEnds.filter((e) => e.code === http2.constants.NGHTTP2_ENHANCE_YOUR_CALM).length;
    expect(cut).toBe(server.unreadAnswers.resets);
    expect(cut).toBeGreaterThanOrEqual(1);
    expect(cut).toBeLessThan(8);
    expect(
      idleEnds.filter((e) => e.code !== undefined && e.code !== http2.constants.NGHTTP2_ENHANCE_YOUR_CALM),
    ).toEqual([]);
    // The honest connection goes on being served.
    expect((await readCall(honest)).status).toBe("0");
    for (const session of idle) session.destroy();
    honest.close();
  });
});
