/**
 * The HTTP/REST frontend's reading and answering: request bodies within their limits (and
 * decompressed), JSON bodies and their checks, and answers as JSON or empty with a status.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { clientError, shownValue } from "@trellis/kserve";
import { type DecompressionBudget, DecompressionBudgetExhausted, inflateWithin } from "@trellis/kserve/wire";
import { Code, StageError } from "@trellis/stage";
import { BytesInFlightExhausted } from "../bytes-in-flight.js";
import { stringifyJson } from "./json.js";

/** Triton's HTTP status for an error code (http_server.cc HttpCodeFromError). */
export function httpStatus(code: Code): number {
  switch (code) {
    case Code.Internal:
      return 500;
    case Code.NotFound:
      return 404;
    // Triton reports a full queue as UNAVAILABLE ("Exceeds maximum queue size"): 503, worth retrying.
    case Code.ResourceExhausted:
    case Code.Unavailable:
    case Code.DeadlineExceeded:
      return 503;
    case Code.Unimplemented:
      return 501;
    case Code.PermissionDenied:
      return 403;
    default:
      return 400;
  }
}

/** An answer with its own HTTP status and message, sent as it is (not through clientError). */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
    /** Close the connection after the answer (the rest of the request is not read). */
    readonly close = false,
  ) {
    super(message);
  }
}

/** Logs error detail withheld from a client (see clientError), when there is a logger for it. */
export type Withheld = ((detail: string, sent: string) => void) | undefined;

export function sendJson(res: ServerResponse, status: number, body: unknown, close = false): void {
  const text = stringifyJson(body);
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(text),
    ...(close ? { connection: "close" } : {}),
  });
  res.end(text);
}

export function sendEmpty(res: ServerResponse, status: number): void {
  res.writeHead(status, { "content-length": 0 });
  res.end();
}

export function sendError(res: ServerResponse, err: unknown, withheld?: Withheld): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  if (err instanceof HttpError) {
    sendJson(res, err.status, { error: err.message }, err.close);
    return;
  }
  // No server paths, URLs or addresses in what the client reads; the log gets them.
  const ce = clientError(err, withheld);
  // The in-flight budgets' "try again later" (BytesInFlightExhausted) is 429, not Triton's 503 for the code.
  sendJson(res, err instanceof BytesInFlightExhausted ? err.httpStatus : httpStatus(ce.code), { error: ce.rawMessage });
}

export const badRequest = (message: string) => new StageError(Code.InvalidArgument, "", message);

export const headerOf = (req: IncomingMessage, name: string): string | undefined => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

export function parseJson(bytes: Uint8Array, what: string, parse: (text: string) => unknown = JSON.parse): unknown {
  if (bytes.byteLength === 0) return {};
  try {
    return parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("utf8"));
  } catch (err) {
    throw new StageError(Code.InvalidArgument, "", `failed to parse the ${what} JSON: ${(err as Error).message}`);
  }
}

/** A JSON body that must be an object (an empty body is an empty object). */
export function parseObject(
  bytes: Uint8Array,
  what: string,
  parse?: (text: string) => unknown,
): Record<string, unknown> {
  const body = parseJson(bytes, what, parse);
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw badRequest(`the ${what} must be a JSON object, got ${shownValue(body)}`);
  }
  return body as Record<string, unknown>;
}

/** A request's `parameters`: absent, or a JSON object. */
export function parametersObject(body: Record<string, unknown>, what: string): Record<string, unknown> {
  const parameters = body.parameters;
  if (parameters === undefined) return {};
  if (typeof parameters !== "object" || parameters === null || Array.isArray(parameters)) {
    throw badRequest(`${what}: 'parameters' must be a JSON object, got ${shownValue(parameters)}`);
  }
  return parameters as Record<string, unknown>;
}

/** Triton's default --http-max-input-size: 64 MiB. */
export const DEFAULT_HTTP_MAX_INPUT_BYTES = 64 * 1024 * 1024;

/** How large a body may be, and the server-wide room for decompressed ones. */
export interface BodyLimits {
  maxBytes: number;
  budget?: DecompressionBudget;
}

/** Triton's bound on a chunked body's non-empty chunks (http_server.cc kMaxChunkedChunks). */
export const MAX_CHUNKED_CHUNKS = 65_536;

/**
 * Triton's words for a body past --http-max-input-size, by what the body is (http_server.cc):
 * a raw binary request's one input (EVBufferToRawInput), a JSON body (EVBufferToJson), and, a
 * bound Triton does not have, the whole of a binary-extension body (JSON header and tensors).
 */
function tooLarge(req: IncomingMessage, size: string, maxBytes: number, midway = false): Error {
  const hint = "Use --http-max-input-size to increase the limit.";
  const headerLength = headerOf(req, "inference-header-content-length");
  const message =
    headerLength === "0"
      ? `Raw input has a byte_size (${size} bytes) that exceeds the maximum allowed value of ${maxBytes} bytes. ${hint}`
      : headerLength !== undefined
        ? `Request body has a byte_size (${size} bytes) that exceeds the maximum allowed value of ${maxBytes} bytes. ${hint}`
        : `request JSON size of ${size} bytes exceeds the maximum allowed input size of ${maxBytes} bytes. ${hint}`;
  // Refused midway through the body: the rest is not read, so the connection cannot carry another request.
  return midway ? new HttpError(400, message, true) : new StageError(Code.InvalidArgument, "", message);
}

/**
 * The request body, refused (400, as Triton does) once it passes `maxBytes`, before it is all
 * buffered, and decompressed when it comes with a Content-Encoding (tritonclient.http's
 * request_compression_algorithm sends gzip or deflate); the decompressed body has the same limit.
 * A chunked body of more than MAX_CHUNKED_CHUNKS pieces is refused as Triton refuses it, the
 * connection closed after the answer so nothing more of it is read. Node shows the body as the
 * pieces its parser hands on, one or more per HTTP chunk (a chunk split across reads counts more
 * than once): a client sending tiny chunks meets the bound exactly, and one sending a body of
 * --http-max-input-size in large chunks stays far below it (64 MiB in 64 KiB reads is 1,024).
 */
export async function readBody(req: IncomingMessage, { maxBytes, budget }: BodyLimits): Promise<Buffer> {
  const encoding = contentEncoding(req);
  const declared = Number(req.headers["content-length"] ?? 0);
  if (declared > maxBytes) throw tooLarge(req, String(declared), maxBytes);
  const { chunks, total } = await readPieces(req, maxBytes);
  const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, total);
  if (encoding === undefined) return body;
  try {
    return await inflateWithin(encoding, body, maxBytes, budget);
  } catch (err) {
    // The server is short of room for decompressed bodies right now, not this body too large.
    if (err instanceof DecompressionBudgetExhausted) throw new HttpError(429, err.message);
    if ((err as { code?: string }).code === "ERR_BUFFER_TOO_LARGE") {
      // Triton's text (data_compressor.h DecompressData).
      throw new StageError(
        Code.InvalidArgument,
        "",
        `Decompressed data size exceeds the maximum allowed value of ${maxBytes} bytes. Use --http-max-input-size to increase the limit.`,
      );
    }
    throw new StageError(
      Code.InvalidArgument,
      "",
      `request body is not valid ${encoding} data: ${(err as Error).message}`,
    );
  }
}

/**
 * The body's pieces as they arrive, within `maxBytes` and, for a chunked body, MAX_CHUNKED_CHUNKS.
 * Read by events rather than `for await`: leaving that loop destroys the request and with it the
 * socket, and the client would meet a reset instead of the answer that says what was wrong. Here
 * a refused body is only paused; the answer goes out with `Connection: close`.
 */
function readPieces(req: IncomingMessage, maxBytes: number): Promise<{ chunks: Buffer[]; total: number }> {
  const chunked = /\bchunked\b/i.test(headerOf(req, "transfer-encoding") ?? "");
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let total = 0;
    const stop = (err: Error) => {
      req.off("data", onData);
      req.off("end", onEnd);
      req.off("error", stop);
      req.off("close", onClose);
      req.pause();
      reject(err);
    };
    // The client went away before the body was all sent: nothing will answer it.
    const onClose = () =>
      stop(new StageError(Code.Canceled, "", "the client closed the request before its body ended"));
    const onData = (piece: Buffer) => {
      if (piece.byteLength === 0) return;
      total += piece.byteLength;
      if (total > maxBytes) return stop(tooLarge(req, String(total), maxBytes, true));
      if (chunked && chunks.length >= MAX_CHUNKED_CHUNKS) {
        const why = `Chunked request body exceeds maximum of ${MAX_CHUNKED_CHUNKS} non-empty chunks. Send fewer or larger HTTP chunks.`;
        return stop(new HttpError(400, why, true));
      }
      chunks.push(piece);
    };
    const onEnd = () => {
      req.off("error", stop);
      req.off("close", onClose);
      resolve({ chunks, total });
    };
    req.on("data", onData);
    req.once("end", onEnd);
    req.once("error", stop);
    req.once("close", onClose);
  });
}

/** The request's Content-Encoding: undefined for none or identity; 415 for one we cannot undo. */
function contentEncoding(req: IncomingMessage): "gzip" | "deflate" | undefined {
  const value = (req.headers["content-encoding"] ?? "").trim().toLowerCase();
  if (value === "" || value === "identity") return undefined;
  if (value === "gzip" || value === "x-gzip") return "gzip";
  if (value === "deflate") return "deflate";
  throw new HttpError(415, `unsupported Content-Encoding '${value}' (supported: gzip, deflate, identity)`);
}
