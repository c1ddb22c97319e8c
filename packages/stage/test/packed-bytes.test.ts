import { describe, expect, it } from "vitest";
import { countFramedElements, framedBytesOf, frameElements, packedBytes } from "../src/packed-bytes.js";

const enc = new TextEncoder();
const framedOf = (...items: string[]) => frameElements(items.map((s) => enc.encode(s)));

describe("packed BYTES elements", () => {
  it("read as the Uint8Array[] they stand for, over the same buffer", () => {
    const framed = framedOf("ab", "", "héllo");
    expect(countFramedElements(framed)).toBe(3);
    const items = packedBytes(framed, 3);
    expect(Array.isArray(items)).toBe(true);
    expect(items.length).toBe(3);
    expect(items.map((b) => new TextDecoder().decode(b))).toEqual(["ab", "", "héllo"]);
    expect([...items].map((b) => b.byteLength)).toEqual([2, 0, 6]);
    expect(items[0]!.buffer).toBe(framed.buffer);
    expect(items[3]).toBeUndefined();
    expect(framedBytesOf(items)).toBe(framed);
    expect(frameElements(items)).toBe(framed);
  });

  it("become a plain array of views when written to", () => {
    const items = packedBytes(framedOf("a", "b"), 2);
    items.push(enc.encode("c"));
    expect(framedBytesOf(items)).toBeUndefined();
    expect(items.map((b) => String.fromCharCode(...b))).toEqual(["a", "b", "c"]);
    expect(Array.from(frameElements(items))).toEqual(Array.from(framedOf("a", "b", "c")));
  });

  it("say why a framing is broken", () => {
    expect(countFramedElements(new Uint8Array([1, 0]))).toMatchObject({
      index: 0,
      kind: "prefix",
      remaining: 2,
      message: expect.stringMatching(/truncated length prefix at byte 0/),
    });
    expect(countFramedElements(new Uint8Array([5, 0, 0, 0, 1]))).toMatchObject({
      kind: "overrun",
      message: expect.stringMatching(/length 5 at byte 0 runs past the end/),
    });
  });
});
