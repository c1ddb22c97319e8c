import { describe, expect, it } from "vitest";
import { framesFromStrings, stringsFromFrames } from "../src/string-frames.js";

/** KServe BYTES framing of `items`, written out the long way. */
function framing(items: string[]): Uint8Array {
  return Buffer.concat(
    items.flatMap((s) => {
      const bytes = Buffer.from(s, "utf8");
      const length = Buffer.alloc(4);
      length.writeUInt32LE(bytes.length);
      return [length, bytes];
    }),
  );
}

describe("string tensors as one framed buffer", () => {
  const cases: [string, string[]][] = [
    ["short ASCII", ["a", "bc", "", "12345678"]],
    ["longer than the ASCII fast path", ["a".repeat(9), "token-with-many-characters"]],
    ["UTF-8 among ASCII", ["héllo", "x", "日本語", "🙂", ""]],
    ["nothing", []],
  ];
  it.each(cases)("%s: framed as KServe frames them, read back as they were", (_, items) => {
    const framed = framesFromStrings(items);
    expect(Buffer.compare(Buffer.from(framed), Buffer.from(framing(items)))).toBe(0);
    expect(stringsFromFrames(framed, items.length)).toEqual(items);
  });

  it("reads a view into a larger buffer, and invalid UTF-8 as U+FFFD", () => {
    const inner = framing(["ab", "cd"]);
    const outer = new Uint8Array(inner.length + 7);
    outer.set(inner, 3);
    expect(stringsFromFrames(outer.subarray(3, 3 + inner.length), 2)).toEqual(["ab", "cd"]);
    expect(stringsFromFrames(new Uint8Array([1, 0, 0, 0, 0xff]), 1)).toEqual(["\ufffd"]);
  });

  it("frames into a buffer of its own, so it can be transferred", () => {
    const framed = framesFromStrings(["a"]);
    expect(framed.byteOffset).toBe(0);
    expect(framed.buffer.byteLength).toBe(framed.byteLength);
  });
});
