/**
 * gRPC's "deflate" message coding for Connect, which ships gzip and br only.
 * Triton (gRPC core) accepts both gzip and deflate, and tritonclient.grpc's
 * compression_algorithm="deflate" sends it; without this such a call fails
 * UNIMPLEMENTED. gRPC's deflate is zlib-wrapped (RFC 1950), as gRPC core
 * writes it; raw deflate is accepted as well.
 */
import { promisify } from "node:util";
import { deflate, inflate, inflateRaw } from "node:zlib";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";

const deflateAsync = promisify(deflate);
const inflateAsync = promisify(inflate);
const inflateRawAsync = promisify(inflateRaw);

/** Whether `bytes` start with a zlib header (RFC 1950: CM 8, header checksum a multiple of 31). */
export function isZlibWrapped(bytes: Uint8Array): boolean {
  const [cmf = 0, flg = 0] = bytes;
  return bytes.byteLength >= 2 && (cmf & 0x0f) === 8 && (cmf * 256 + flg) % 31 === 0;
}

/**
 * Inflates a "deflate" body, zlib-wrapped (RFC 1950, what gRPC core and HTTP's
 * Content-Encoding mean) or raw, as some clients send it; `maxOutputLength` bounds it
 * (past it zlib throws ERR_BUFFER_TOO_LARGE).
 */
export function inflateDeflate(bytes: Uint8Array, maxOutputLength: number): Promise<Buffer> {
  return (isZlibWrapped(bytes) ? inflateAsync : inflateRawAsync)(bytes, { maxOutputLength });
}

export const compressionDeflate: Compression = {
  name: "deflate",
  async compress(bytes) {
    return new Uint8Array(await deflateAsync(bytes));
  },
  async decompress(bytes, readMaxBytes) {
    if (bytes.byteLength === 0) return new Uint8Array(0);
    try {
      const inflated = await inflateDeflate(bytes, readMaxBytes);
      return new Uint8Array(inflated.buffer as ArrayBuffer, inflated.byteOffset, inflated.byteLength);
    } catch (err) {
      if ((err as { code?: string }).code === "ERR_BUFFER_TOO_LARGE") {
        throw new ConnectError(
          `message is larger than configured readMaxBytes ${readMaxBytes} after decompression`,
          Code.ResourceExhausted,
        );
      }
      throw new ConnectError(`invalid deflate data: ${(err as Error).message}`, Code.InvalidArgument);
    }
  },
};
