import { EventEmitter } from "node:events";
import { deflateRawSync, deflateSync, gzipSync, inflateSync } from "node:zlib";
import { Code, ConnectError } from "@connectrpc/connect";
import { describe, expect, it } from "vitest";
import {
  compressionDeflate,
  DecompressionBudget,
  DecompressionBudgetExhausted,
  holdDecompressedUntilClose,
  inflateWithin,
  isZlibWrapped,
} from "../src/compression.js";

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

describe("DecompressionBudget", () => {
  const MiB = 1024 * 1024;
  const zeros = (n: number) => gzipSync(new Uint8Array(n), { level: 1 });

  it("holds what a request inflated until it closes, refusing others past the budget meanwhile", async () => {
    const budget = new DecompressionBudget(2 * MiB, "--flag");
    const res = new EventEmitter();
    const first = await holdDecompressedUntilClose(res, () =>
      inflateWithin("gzip", zeros(1.5 * MiB), 64 * MiB, budget),
    );
    expect(first.byteLength).toBe(1.5 * MiB);
    expect(budget.inUse).toBe(1.5 * MiB);
    const second = await inflateWithin("gzip", zeros(MiB), 64 * MiB, budget).catch((e: unknown) => e);
    expect(second).toBeInstanceOf(DecompressionBudgetExhausted);
    expect((second as Error).message).toContain("use --flag to raise it");
    // The refused call gave back what it had taken; the first keeps its share until its request closes.
    expect(budget.inUse).toBe(1.5 * MiB);
    res.emit("close");
    expect(budget.inUse).toBe(0);
    expect((await inflateWithin("gzip", zeros(MiB), 64 * MiB, budget)).byteLength).toBe(MiB);
    // Outside a request, the share is given back as soon as inflating is done.
    expect(budget.inUse).toBe(0);
  });

  it("stops at the per-message cap with zlib's error code, giving back its share", async () => {
    const budget = new DecompressionBudget(64 * MiB);
    const err = await inflateWithin("gzip", zeros(4 * MiB), MiB, budget).catch((e: unknown) => e);
    expect((err as { code?: string }).code).toBe("ERR_BUFFER_TOO_LARGE");
    expect(budget.inUse).toBe(0);
  });
});
