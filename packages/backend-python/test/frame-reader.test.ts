/**
 * The stub's frame reader: frames split however the pipe splits them come out whole, and the
 * bytes it copies stay linear in the answer (it used to concatenate everything buffered on
 * every chunk: quadratic), and a frame over the bound has its body dropped unread, judged from its
 * length prefix.
 */
import { describe, expect, it } from "vitest";
import { encodeFrame, FrameReader } from "../src/frames.js";

function frameOf(bodyBytes: number, seed: number): Buffer {
  const body = Buffer.alloc(bodyBytes);
  for (let i = 0; i < bodyBytes; i += 4096) body[i] = (i / 4096 + seed) & 0xff;
  return encodeFrame({ type: "result", seed }, [body]);
}

function feed(reader: FrameReader, stream: Buffer, chunkBytes: number) {
  const frames = [];
  for (let at = 0; at < stream.byteLength; at += chunkBytes)
    frames.push(...reader.push(stream.subarray(at, at + chunkBytes)));
  return frames;
}

describe("FrameReader", () => {
  it("reassembles a 16 MiB answer from 64 KiB pipe chunks copying it once", () => {
    const frame = frameOf(16 << 20, 3);
    const reader = new FrameReader(1 << 30);
    const frames = feed(reader, frame, 64 << 10);
    expect(frames).toHaveLength(1);
    expect(frames[0]?.header).toEqual({ type: "result", seed: 3 });
    expect(Buffer.compare(frames[0]?.body as Buffer, frame.subarray(frame.byteLength - (16 << 20)))).toBe(0);
    // Linear: at most the frame's own size (the old reader copied ~128 GiB here).
    expect(reader.bytesCopied).toBeLessThanOrEqual(frame.byteLength);
  });

  it("reads frames split into 1-byte chunks, copying each frame once", () => {
    const stream = Buffer.concat([frameOf(200_000, 1), frameOf(0, 2), frameOf(70_000, 3)]);
    const reader = new FrameReader(1 << 30);
    const frames = feed(reader, stream, 1);
    expect(frames.map((f) => f.header.seed)).toEqual([1, 2, 3]);
    expect(frames.map((f) => f.body.byteLength)).toEqual([200_000, 0, 70_000]);
    expect(reader.bytesCopied).toBeLessThanOrEqual(stream.byteLength);
  });

  it("fills a large body as its chunks arrive, and reads the frames around it whole, however the stream is cut", () => {
    const parts = [frameOf(1000, 1), frameOf(2 << 20, 2), frameOf(10, 3), frameOf((1 << 20) + 5, 4), frameOf(0, 5)];
    const stream = Buffer.concat(parts);
    for (const chunkBytes of [997, 64 << 10, (1 << 20) + 3, stream.byteLength]) {
      const reader = new FrameReader(1 << 30);
      const frames = feed(reader, stream, chunkBytes);
      expect(frames.map((f) => f.header.seed)).toEqual([1, 2, 3, 4, 5]);
      for (const [i, f] of frames.entries()) {
        const want = parts[i] as Buffer;
        expect(Buffer.compare(f.body, want.subarray(want.byteLength - f.body.byteLength)), `frame ${i}`).toBe(0);
      }
      expect(frames.map((f) => f.body.byteLength)).toEqual([1000, 2 << 20, 10, (1 << 20) + 5, 0]);
      expect(reader.bytesCopied).toBeLessThanOrEqual(stream.byteLength);
    }
  });

  it("gives views, copying nothing, for frames that lie within one chunk", () => {
    const stream = Buffer.concat([frameOf(1000, 1), frameOf(2000, 2), frameOf(3000, 3)]);
    const reader = new FrameReader(1 << 30);
    const frames = reader.push(stream);
    expect(frames.map((f) => f.header.seed)).toEqual([1, 2, 3]);
    expect(reader.bytesCopied).toBe(0);
  });

  it("refuses a frame whose header alone is over the bound, from its prefix, before anything else arrives", () => {
    const reader = new FrameReader(1 << 20);
    const prefix = Buffer.alloc(8);
    prefix.writeUInt32LE(2 << 20, 0);
    prefix.writeUInt32LE(2, 4);
    expect(() => reader.push(prefix)).toThrow(/2097162-byte frame, over the 1048576-byte bound/);
    expect(reader.bytesCopied).toBe(0);
  });

  it("drops the body of a frame over the bound unread, hands on its header, and reads the frames after it", () => {
    const stream = Buffer.concat([frameOf(1000, 1), frameOf(3 << 20, 2), frameOf(2000, 3)]);
    for (const chunkBytes of [1, 4096, 64 << 10, stream.byteLength]) {
      const reader = new FrameReader(1 << 20);
      const frames = feed(reader, stream, chunkBytes);
      expect(frames.map((f) => f.header.seed)).toEqual([1, 2, 3]);
      expect(frames.map((f) => f.body.byteLength)).toEqual([1000, 0, 2000]);
      expect(frames[1]?.droppedBytes).toBe(frameOf(3 << 20, 2).byteLength);
      // Nothing of the dropped body was copied.
      expect(reader.bytesCopied).toBeLessThanOrEqual(3000 + 200);
    }
  });
});
