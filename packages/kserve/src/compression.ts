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
 * With a DecompressionBudget, the bytes inflated across all requests at once are
 * bounded too: many bombs in parallel cost at most the budget, not the cap each.
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { promisify } from "node:util";
import {
  createBrotliDecompress,
  createGunzip,
  createInflate,
  createInflateRaw,
  deflate,
  inflate,
  inflateRaw,
} from "node:zlib";
import { Code, ConnectError } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";
import { compressionBrotli, compressionGzip } from "@connectrpc/connect-node";

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

/** Default DecompressionBudget: four messages at the default 64 MiB cap. */
export const DEFAULT_DECOMPRESSION_BUDGET_BYTES = 256 * 1024 * 1024;

/**
 * A server-wide bound on the bytes of decompressed request messages and bodies held at once,
 * across every request on every port: each request reserves what it inflates, chunk by chunk,
 * and gives it back when it is answered (or fails). A request whose inflating would pass the
 * budget is refused at once (RESOURCE_EXHAUSTED, naming `flag`), however small its own message.
 */
export class DecompressionBudget {
  private used = 0;

  constructor(
    readonly limitBytes: number,
    readonly flag?: string,
  ) {}

  /** Bytes reserved right now. */
  get inUse(): number {
    return this.used;
  }

  /** Reserves `bytes` if they fit in what is left. */
  tryReserve(bytes: number): boolean {
    if (this.used + bytes > this.limitBytes) return false;
    this.used += bytes;
    return true;
  }

  release(bytes: number): void {
    this.used = Math.max(0, this.used - bytes);
  }

  /** The refusal of a request whose inflating would pass the budget. */
  exhausted(): ConnectError {
    const hint = this.flag ? `; use ${this.flag} to raise it` : "";
    return new ConnectError(
      `decompressed request messages in flight would exceed the server's budget of ${this.limitBytes} bytes: try again later${hint}`,
      Code.ResourceExhausted,
    );
  }
}

/** Thrown by inflateWithin when the budget has no room left (see DecompressionBudget.exhausted). */
export class DecompressionBudgetExhausted extends Error {
  constructor(readonly budget: DecompressionBudget) {
    super(budget.exhausted().rawMessage);
  }
}

/** A request's reservations, released when it is answered (see holdDecompressedUntilClose). */
type Held = { budget: DecompressionBudget; bytes: number }[];
const requestHoldings = new AsyncLocalStorage<Held>();

/**
 * Runs `handle` (one request's handler) so that what it decompresses within a budget stays
 * reserved until `res` closes: answered, refused or reset. Outside such a call, a reservation
 * lasts only while inflating.
 */
export function holdDecompressedUntilClose<T>(
  res: { once(event: "close", listener: () => void): unknown },
  handle: () => T,
): T {
  const held: Held = [];
  res.once("close", () => {
    for (const h of held.splice(0)) h.budget.release(h.bytes);
  });
  return requestHoldings.run(held, handle);
}

export type Coding = "gzip" | "deflate" | "br";

function inflater(coding: Coding, bytes: Uint8Array) {
  const chunkSize = 256 * 1024;
  if (coding === "gzip") return createGunzip({ chunkSize });
  if (coding === "br") return createBrotliDecompress({ chunkSize });
  return isZlibWrapped(bytes) ? createInflate({ chunkSize }) : createInflateRaw({ chunkSize });
}

/**
 * `bytes` inflated with `coding`, at most `maxBytes` of output (past it: an error with code
 * ERR_BUFFER_TOO_LARGE, as zlib's maxOutputLength) and, with a `budget`, only while the budget
 * has room for each chunk (else DecompressionBudgetExhausted). Inflating stops at once either
 * way; what a failed call reserved is given back at once, what a successful one reserved when
 * the request closes (see holdDecompressedUntilClose), or at once outside a request.
 */
export function inflateWithin(
  coding: Coding,
  bytes: Uint8Array,
  maxBytes: number,
  budget?: DecompressionBudget,
): Promise<Buffer> {
  const held = requestHoldings.getStore();
  return new Promise((resolve, reject) => {
    const z = inflater(coding, bytes);
    const chunks: Buffer[] = [];
    let total = 0;
    let settled = false;
    const fail = (err: Error) => {
      if (settled) return;
      settled = true;
      budget?.release(total);
      chunks.length = 0;
      z.destroy();
      reject(err);
    };
    z.on("data", (chunk: Buffer) => {
      if (settled) return;
      if (total + chunk.byteLength > maxBytes) {
        const err = new RangeError(`decompressed output exceeds ${maxBytes} bytes`) as RangeError & { code: string };
        err.code = "ERR_BUFFER_TOO_LARGE";
        return fail(err);
      }
      if (budget && !budget.tryReserve(chunk.byteLength)) return fail(new DecompressionBudgetExhausted(budget));
      total += chunk.byteLength;
      chunks.push(chunk);
    });
    z.on("error", fail);
    z.on("end", () => {
      if (settled) return;
      settled = true;
      if (budget) {
        if (held) held.push({ budget, bytes: total });
        else budget.release(total);
      }
      resolve(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, total));
    });
    z.end(bytes);
  });
}

function decompressor(name: Coding, flag: string | undefined, budget?: DecompressionBudget): Compression["decompress"] {
  return async (bytes, readMaxBytes) => {
    if (bytes.byteLength === 0) return new Uint8Array(0);
    try {
      const inflated = await inflateWithin(name, bytes, readMaxBytes, budget);
      return new Uint8Array(inflated.buffer as ArrayBuffer, inflated.byteOffset, inflated.byteLength);
    } catch (err) {
      if (err instanceof DecompressionBudgetExhausted) throw err.budget.exhausted();
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
 * refused RESOURCE_EXHAUSTED naming the limit and `flag`, the setting that raises it. With a
 * `budget`, inflating also takes its room from it (see DecompressionBudget).
 */
export function requestCompression(flag?: string, budget?: DecompressionBudget): Compression[] {
  return [
    { name: "gzip", compress: compressionGzip.compress, decompress: decompressor("gzip", flag, budget) },
    {
      name: "deflate",
      async compress(bytes) {
        return new Uint8Array(await deflateAsync(bytes));
      },
      decompress: decompressor("deflate", flag, budget),
    },
    { name: "br", compress: compressionBrotli.compress, decompress: decompressor("br", flag, budget) },
  ];
}

/** gRPC's deflate coding (for clients too: Connect's acceptCompression / sendCompression). */
export const compressionDeflate: Compression = requestCompression()[1] as Compression;
