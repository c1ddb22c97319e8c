import { describe, expect, it } from "vitest";
import { fromGrpcCore, IdleStreamFrameFilter } from "../src/grpc/http2-resets.js";

const PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "latin1");

function frame(type: number, stream: number, payload: Buffer | number[]): Buffer {
  const body = Buffer.from(payload);
  const head = Buffer.alloc(9);
  head.writeUIntBE(body.length, 0, 3);
  head[3] = type;
  head.writeUInt32BE(stream, 5);
  return Buffer.concat([head, body]);
}

const settings = frame(0x4, 0, [0, 4, 0, 0, 0xff, 0xff]);
const headers = (stream: number) => frame(0x1, stream, [0x82, 0x86, 0x84]);
const data = (stream: number, size: number) => frame(0x0, stream, Buffer.alloc(size, stream));
const reset = (stream: number) => frame(0x3, stream, [0, 0, 0, 8]);
const windowUpdate = (stream: number) => frame(0x8, stream, [0, 0, 0, 5]);

/** What the filter passes of `input` cut into pieces of `size` bytes. */
function filtered(input: Buffer, size: number): Buffer {
  const filter = new IdleStreamFrameFilter();
  const out: Buffer[] = [];
  for (let i = 0; i < input.length; i += size) out.push(filter.push(input.subarray(i, i + size)));
  return Buffer.concat(out);
}

describe("IdleStreamFrameFilter", () => {
  it("drops RST_STREAM and WINDOW_UPDATE for streams the client has not opened, however the bytes are cut", () => {
    // As grpcio wrote them: a reset of stream 5 ahead of the HEADERS of streams 1 and 3.
    const input = Buffer.concat([
      PREFACE,
      settings,
      reset(5),
      windowUpdate(5),
      headers(1),
      windowUpdate(1),
      data(1, 40),
      headers(3),
      reset(1),
      windowUpdate(0),
      reset(9),
      data(3, 7),
    ]);
    const expected = Buffer.concat([
      PREFACE,
      settings,
      headers(1),
      windowUpdate(1),
      data(1, 40),
      headers(3),
      reset(1),
      windowUpdate(0),
      data(3, 7),
    ]);
    for (const size of [1, 2, 5, 8, 9, 10, 13, 24, 33, 64, input.length]) {
      expect(filtered(input, size).equals(expected), `pieces of ${size}`).toBe(true);
    }
  });

  it("passes a chunk with nothing to drop as the same buffer, and bytes that are not HTTP/2 untouched", () => {
    const filter = new IdleStreamFrameFilter();
    const first = Buffer.concat([PREFACE, settings, headers(1)]);
    expect(filter.push(first)).toBe(first);
    const next = Buffer.concat([data(1, 100), reset(1)]);
    expect(filter.push(next)).toBe(next);

    const http1 = Buffer.from("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    const other = new IdleStreamFrameFilter();
    expect(other.push(http1)).toBe(http1);
    const more = reset(5);
    expect(other.push(more)).toBe(more);
  });
});

describe("fromGrpcCore", () => {
  // First SETTINGS frames as the clients send them (captured on loopback).
  const setting = (id: number, value: number) => {
    const b = Buffer.alloc(6);
    b.writeUInt16BE(id, 0);
    b.writeUInt32BE(value, 2);
    return b;
  };
  const grpcio = frame(
    0x4,
    0,
    Buffer.concat([
      setting(0x2, 0),
      setting(0x3, 0),
      setting(0x4, 4194303),
      setting(0x5, 4194303),
      setting(0x6, 8192),
      setting(0xfe03, 1),
    ]),
  );
  const grpcJs = frame(0x4, 0, setting(0x4, 65535));
  const nodeHttp2 = frame(0x4, 0, []);

  it("tells C-core (gRPC's own settings) from other clients once its first SETTINGS is in", () => {
    const core = Buffer.concat([PREFACE, grpcio, headers(1)]);
    for (let n = 0; n < PREFACE.length + grpcio.length; n++) expect(fromGrpcCore(core.subarray(0, n))).toBeUndefined();
    expect(fromGrpcCore(core.subarray(0, PREFACE.length + grpcio.length))).toBe(true);
    expect(fromGrpcCore(core)).toBe(true);
    expect(fromGrpcCore(Buffer.concat([PREFACE, grpcJs]))).toBe(false);
    expect(fromGrpcCore(Buffer.concat([PREFACE, nodeHttp2]))).toBe(false);
  });

  it("answers at once for bytes that are not HTTP/2 or do not start with SETTINGS", () => {
    expect(fromGrpcCore(Buffer.from("GET / HTTP/1.1\r\n"))).toBe(false);
    expect(fromGrpcCore(Buffer.from("PRX"))).toBe(false);
    expect(fromGrpcCore(Buffer.concat([PREFACE, headers(1)]))).toBe(false);
  });
});
