import { describe, expect, it } from "vitest";
import { IdleStreamFrameFilter } from "./http2-resets.js";

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
