/**
 * Compressed inference responses on the gRPC port, as tritonserver's
 * --grpc-infer-response-compression-level: off by default (raw tensors compress
 * poorly and cost time), and at a level the algorithm gRPC core picks for it
 * among those the client accepts (grpc-accept-encoding).
 */
import { promisify } from "node:util";
import { deflate, gzip } from "node:zlib";

export const RESPONSE_COMPRESSION_LEVELS = ["none", "low", "medium", "high"] as const;
export type ResponseCompressionLevel = (typeof RESPONSE_COMPRESSION_LEVELS)[number];
export type ResponseAlgorithm = "gzip" | "deflate";

/** gRPC core's ranking, least compression first. */
const RANKED: ResponseAlgorithm[] = ["gzip", "deflate"];

/**
 * The algorithm for `level` given the client's grpc-accept-encoding, as gRPC core
 * chooses it: among the accepted ones, in the ranking gzip then deflate, low takes
 * the first, medium the middle one, high the last; undefined sends the response as it is.
 */
export function responseAlgorithm(
  level: ResponseCompressionLevel,
  acceptEncoding: string | undefined,
): ResponseAlgorithm | undefined {
  if (level === "none" || !acceptEncoding) return undefined;
  const accepted = new Set(acceptEncoding.split(",").map((name) => name.trim().toLowerCase()));
  const usable = RANKED.filter((name) => accepted.has(name));
  if (usable.length === 0) return undefined;
  if (level === "low") return usable[0];
  if (level === "medium") return usable[Math.floor(usable.length / 2)];
  return usable[usable.length - 1];
}

const gzipAsync = promisify(gzip);
const deflateAsync = promisify(deflate);

/** `message` compressed with `algorithm` (gRPC's deflate is zlib-wrapped, as gRPC core writes it). */
export async function compressMessage(algorithm: ResponseAlgorithm, message: Uint8Array): Promise<Uint8Array> {
  return new Uint8Array(await (algorithm === "gzip" ? gzipAsync(message) : deflateAsync(message)));
}
