/**
 * Request message codings for Connect's handlers, and the size cap they keep.
 *
 * gRPC's "deflate" coding, which Connect does not ship (it has gzip and br):
 * Triton (gRPC core) accepts both gzip and deflate, and tritonclient.grpc's
 * compression_algorithm="deflate" sends it; without this such a call fails
 * UNIMPLEMENTED. gRPC's deflate is zlib-wrapped (RFC 1950), as gRPC core
 * writes it; raw deflate is accepted as well.
 *
 * Every coding inflates in zlib's chunks and stops as soon as the output
 * passes the cap (zlib's maxOutputLength), so a small compressed message that
 * would inflate to gigabytes (a compression bomb) costs at most the cap.
 */
import { promisify } from "node:util";
import { brotliDecompress, deflate, gunzip, inflate, inflateRaw } from "node:zlib";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";

const deflateAsync = promisify(deflate);
const inflateAsync = promisify(inflate);
const inflateRawAsync = promisify(inflateRaw);
const gunzipAsync = promisify(gunzip);
const brotliDecompressAsync = promisify(brotliDecompress);

/** Whether `bytes` start with a zlib header (RFC 1950: CM 8, header checksum a multiple of 31). */
export function isZlibWrapped(bytes: Uint8Array): boolean {
  const [cmf = 0, flg = 0] = bytes;
  return bytes.byteLength >= 2 && (cmf & 0x0f) === 8 && (cmf * 256 + flg) % 31 === 0;
}

/**
 * Inflates a "deflate" body, zlib-wrapped (RFC 1950, what gRPC core and HTTP's
 * Content-Encoding mean) or raw, as some clients send it; `maxOutputLength` bounds it
 * (past it zlib stops and throws ERR_BUFFER_TOO_LARGE).
 */
export function inflateDeflate(bytes: Uint8Array, maxOutputLength: number): Promise<Buffer> {
  return (isZlibWrapped(bytes) ? inflateAsync : inflateRawAsync)(bytes, { maxOutputLength });
}

/**
 * RESOURCE_EXHAUSTED for a request message over `limit` bytes: of `size` bytes when its
 * length is known (the envelope's prefix), else of more than the limit once inflated with
 * `coding`. Names `flag`, the setting that raises the limit, when given.
 */
export function inputTooLarge(limit: number, size: number | undefined, flag?: string, coding?: string): ConnectError {
  const what =
    size === undefined
      ? `${coding ? `${coding}-decompressed ` : ""}request message of more than ${limit} bytes`
      : `request message of ${size} bytes`;
  const hint = flag ? `; use ${flag} to increase the limit` : "";
  return new ConnectError(`${what} exceeds the maximum allowed value of ${limit} bytes${hint}`, Code.ResourceExhausted);
}

/**
 * Connect's own refusals of a message over readMaxBytes (its envelope reader's), reworded
 * as inputTooLarge words them; any other message is returned as is.
 */
export function namingInputLimit(message: string, flag?: string): string {
  const known = /^message size (\d+) is larger than configured readMaxBytes (\d+)$/.exec(message);
  if (known) return inputTooLarge(Number(known[2]), Number(known[1]), flag).rawMessage;
  const unknown = /^message size is larger than configured readMaxBytes (\d+)$/.exec(message);
  if (unknown) return inputTooLarge(Number(unknown[1]), undefined, flag).rawMessage;
  return message;
}

function decompressor(
  name: string,
  inflateUpTo: (bytes: Uint8Array, maxOutputLength: number) => Promise<Buffer>,
  flag: string | undefined,
): Compression["decompress"] {
  return async (bytes, readMaxBytes) => {
    if (bytes.byteLength === 0) return new Uint8Array(0);
    try {
      const inflated = await inflateUpTo(bytes, readMaxBytes);
      return new Uint8Array(inflated.buffer as ArrayBuffer, inflated.byteOffset, inflated.byteLength);
    } catch (err) {
      if ((err as { code?: string }).code === "ERR_BUFFER_TOO_LARGE") {
        throw inputTooLarge(readMaxBytes, undefined, flag, name);
      }
      throw new ConnectError(`invalid ${name} data: ${(err as Error).message}`, Code.InvalidArgument);
    }
  };
}

/**
 * The request codings a server accepts: gzip, deflate (gRPC's two, both of which Triton
 * takes) and br, each inflated only up to the handler's readMaxBytes; a message past it is
 * refused RESOURCE_EXHAUSTED naming the limit and `flag`, the setting that raises it.
 */
export function requestCompression(flag?: string): Compression[] {
  return [
    {
      name: "gzip",
      compress: compressionGzip.compress,
      decompress: decompressor("gzip", (b, max) => gunzipAsync(b, { maxOutputLength: max }), flag),
    },
    {
      name: "deflate",
      async compress(bytes) {
        return new Uint8Array(await deflateAsync(bytes));
      },
      decompress: decompressor("deflate", inflateDeflate, flag),
    },
    {
      name: "br",
      compress: compressionBrotli.compress,
      decompress: decompressor("br", (b, max) => brotliDecompressAsync(b, { maxOutputLength: max }), flag),
    },
  ];
}

/** gRPC's deflate coding (for clients too: Connect's acceptCompression / sendCompression). */
export const compressionDeflate: Compression = requestCompression()[1] as Compression;
