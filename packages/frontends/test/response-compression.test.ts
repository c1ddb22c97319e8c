import { gunzipSync, inflateSync } from "node:zlib";
import { describe, expect, it } from "vitest";
import { compressMessage, responseAlgorithm } from "../src/grpc/response-compression.js";

describe("inference response compression", () => {
  it("picks what gRPC core picks for each level among the algorithms the client accepts", () => {
    const both = "identity,deflate,gzip";
    expect(responseAlgorithm("none", both)).toBeUndefined();
    expect(responseAlgorithm("low", both)).toBe("gzip");
    expect(responseAlgorithm("medium", both)).toBe("deflate");
    expect(responseAlgorithm("high", both)).toBe("deflate");
    expect(responseAlgorithm("high", "gzip, br")).toBe("gzip");
    expect(responseAlgorithm("low", "DEFLATE")).toBe("deflate");
    expect(responseAlgorithm("high", "identity,br")).toBeUndefined();
    expect(responseAlgorithm("high", undefined)).toBeUndefined();
  });

  it("compresses as gRPC's gzip and zlib-wrapped deflate", async () => {
    const message = new TextEncoder().encode("tensor ".repeat(100));
    const gz = await compressMessage("gzip", message);
    const zl = await compressMessage("deflate", message);
    expect(gz.byteLength).toBeLessThan(message.byteLength);
    expect(new Uint8Array(gunzipSync(gz))).toEqual(message);
    expect(new Uint8Array(inflateSync(zl))).toEqual(message);
  });
});
