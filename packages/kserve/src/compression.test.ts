import { deflateRawSync, deflateSync, inflateSync } from "node:zlib";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import { compressionDeflate, isZlibWrapped } from "./compression.js";

const message = new TextEncoder().encode("tensor bytes ".repeat(100));

describe("compressionDeflate (gRPC's deflate coding)", () => {
  it("reads zlib-wrapped deflate, as gRPC core writes it, and raw deflate", async () => {
    expect(isZlibWrapped(deflateSync(message))).toBe(true);
    expect(isZlibWrapped(deflateRawSync(message))).toBe(false);
    expect(await compressionDeflate.decompress(deflateSync(message), 1 << 20)).toEqual(message);
    expect(await compressionDeflate.decompress(deflateRawSync(message), 1 << 20)).toEqual(message);
    expect(await compressionDeflate.decompress(new Uint8Array(0), 1 << 20)).toEqual(new Uint8Array(0));
  });

  it("writes zlib-wrapped deflate", async () => {
    const compressed = await compressionDeflate.compress(message);
    expect(isZlibWrapped(compressed)).toBe(true);
    expect(new Uint8Array(inflateSync(compressed))).toEqual(message);
  });

  it("refuses a message that inflates past readMaxBytes with RESOURCE_EXHAUSTED, and bad data with INVALID_ARGUMENT", async () => {
    const big = await compressionDeflate.decompress(deflateSync(message), 100).catch((e: unknown) => e);
    expect(big).toBeInstanceOf(ConnectError);
    expect((big as ConnectError).code).toBe(Code.ResourceExhausted);
    expect((big as ConnectError).rawMessage).toBe(
      "deflate-decompressed request message of more than 100 bytes exceeds the maximum allowed value of 100 bytes",
    );
    const bad = await compressionDeflate
      .decompress(new Uint8Array([0x78, 0x9c, 1, 2, 3]), 100)
      .catch((e: unknown) => e);
    expect((bad as ConnectError).code).toBe(Code.InvalidArgument);
    expect((bad as ConnectError).rawMessage).toMatch(/^invalid deflate data: /);
  });
});
