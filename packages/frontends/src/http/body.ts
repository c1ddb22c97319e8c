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
  ) {
    super(message);
  }
}

/** Logs error detail withheld from a client (see clientError), when there is a logger for it. */
export type Withheld = ((detail: string, sent: string) => void) | undefined;

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = stringifyJson(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
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
    sendJson(res, err.status, { error: err.message });
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

/**
 * The request body, refused (400, as Triton does) once it passes `maxBytes`, before it is all
 * buffered, and decompressed when it comes with a Content-Encoding (tritonclient.http's
 * request_compression_algorithm sends gzip or deflate); the decompressed body has the same limit.
 */
export async function readBody(req: IncomingMessage, { maxBytes, budget }: BodyLimits): Promise<Buffer> {
  // Triton's text (http_server.cc EVBufferToJson); a body refused before it is all read gives the bytes read so far.
  const tooLarge = (size: string, what = "request JSON size") =>
    new StageError(
      Code.InvalidArgument,
      "",
      `${what} of ${size} bytes exceeds the maximum allowed input size of ${maxBytes} bytes. Use --http-max-input-size to increase the limit.`,
    );
  const encoding = contentEncoding(req);
  const declared = Number(req.headers["content-length"] ?? 0);
  if (declared > maxBytes) throw tooLarge(String(declared));
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of req) {
    total += (chunk as Buffer).byteLength;
    if (total > maxBytes) throw tooLarge(String(total));
    chunks.push(chunk as Buffer);
  }
  const body = chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks);
  if (encoding === undefined) return body;
  try {
    return await inflateWithin(encoding, body, maxBytes, budget);
  } catch (err) {
    // The server is short of room for decompressed bodies right now, not this body too large.
    if (err instanceof DecompressionBudgetExhausted) throw new HttpError(429, err.message);
    if ((err as { code?: string }).code === "ERR_BUFFER_TOO_LARGE") {
      throw tooLarge(`more than ${maxBytes}`, `${encoding}-decompressed request JSON size`);
    }
    throw new StageError(
      Code.InvalidArgument,
      "",
      `request body is not valid ${encoding} data: ${(err as Error).message}`,
    );
  }
}

/** The request's Content-Encoding: undefined for none or identity; 415 for one we cannot undo. */
function contentEncoding(req: IncomingMessage): "gzip" | "deflate" | undefined {
  const value = (req.headers["content-encoding"] ?? "").trim().toLowerCase();
  if (value === "" || value === "identity") return undefined;
  if (value === "gzip" || value === "x-gzip") return "gzip";
  if (value === "deflate") return "deflate";
  throw new HttpError(415, `unsupported Content-Encoding '${value}' (supported: gzip, deflate, identity)`);
}
