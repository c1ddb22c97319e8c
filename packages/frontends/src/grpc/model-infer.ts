/**
 * A direct path for unary ModelInfer over gRPC, the call a client makes
 * once per image. Connect's universal handler (a pipeline of async
 * iterables per call) costs about 1.1 ms of latency and 2.5 ms of CPU per
 * call more than answering the HTTP/2 stream directly (measured on a
 * 2-core VM, idle between calls, as at concurrency 1): over half of what
 * the server may add to preprocess + inference. Everything else (other
 * methods, gRPC-Web, Connect, compressed messages) still goes through
 * Connect, and both paths run the same handleModelInfer. The gRPC details
 * (content type, envelope, timeout format, status trailers) come from
 * Connect's own protocol code: helpers Connect marks internal, held by the
 * exact version pinned in package.json and by this path's tests.
 */
import type http2 from "node:http2";
import { fromBinary, toBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { compressedFlag, encodeEnvelope } from "@connectrpc/connect/protocol";
import {
  contentTypeProto,
  headerAcceptEncoding,
  headerEncoding,
  headerTimeout,
  parseContentType,
  parseTimeout,
  setTrailerStatus,
} from "@connectrpc/connect/protocol-grpc";
import { inputTooLarge } from "@trellis/kserve/wire";
import {
  type ModelInferRequest,
  ModelInferRequestSchema,
  type ModelInferResponse,
  ModelInferResponseSchema,
} from "@trellis/protocol";
import type { RequestTrace } from "@trellis/stage";
import { nowNs } from "@trellis/stage";
import { deadlineTimer, toConnectError } from "@trellis/stage/backend";
import { compressMessage, type ResponseCompressionLevel, responseAlgorithm } from "./response-compression.js";

/**
 * grpc-message as the gRPC spec writes it: printable ASCII as is, everything else (and '%')
 * percent-encoded as UTF-8. Connect encodes with encodeURIComponent, which also escapes
 * ',', ':', '/' and the like; grpc-js decodes with decodeURI, which leaves those escaped,
 * so its users read "model%3A step 0%2C ...". Both ends read this form as meant.
 */
export function encodeGrpcMessage(message: string): string {
  let out = "";
  for (const b of new TextEncoder().encode(message)) {
    out +=
      b >= 0x20 && b <= 0x7e && b !== 0x25
        ? String.fromCharCode(b)
        : `%${b.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** `trailers` with a Connect-encoded grpc-message re-encoded as encodeGrpcMessage does. */
export function withReadableGrpcMessage(trailers: http2.OutgoingHttpHeaders): http2.OutgoingHttpHeaders {
  const message = trailers["grpc-message"];
  if (typeof message !== "string") return trailers;
  let text: string;
  try {
    text = decodeURIComponent(message);
  } catch {
    return trailers;
  }
  return { ...trailers, "grpc-message": encodeGrpcMessage(text) };
}

/** When the call's stream arrived and its request was read (nowNs), and the trace its request got, if sampled. */
export interface GrpcCallTimes {
  readStartNs: number;
  readEndNs: number;
  /** Set by the infer function when it traces the request: the handler stamps the send and ends it. */
  trace?: RequestTrace;
  /** The call's headers (gRPC metadata), by lower-case name. */
  header(name: string): string | undefined;
  /** Every header of the call, name (lower case) and value. */
  headers(): Iterable<[string, string | string[] | undefined]>;
}

/** Runs one decoded ModelInfer; `signal` aborts on deadline or client cancel. */
export type ModelInferFn = (
  request: ModelInferRequest,
  signal: AbortSignal,
  call: GrpcCallTimes,
) => Promise<ModelInferResponse>;

/** Handles the request and returns true, or returns false for Connect to handle it. */
export type FastPath = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => boolean;

export const MODEL_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer";
const ENVELOPE_HEADER_BYTES = 5;

/** gRPC, binary, uncompressed: what this path serves. */
function servedHere(req: http2.Http2ServerRequest): boolean {
  if (req.method !== "POST" || req.url !== MODEL_INFER_PATH) return false;
  if (!parseContentType(req.headers["content-type"] ?? null)?.binary) return false;
  const encoding = req.headers[headerEncoding.toLowerCase()];
  return encoding === undefined || encoding === "identity";
}

/**
 * The single message of a unary call's body, worded as Connect's envelope
 * errors. A malformed body is the client's fault: INVALID_ARGUMENT throughout.
 */
function unaryMessage(body: Buffer): Uint8Array {
  if (body.length === 0) {
    throw new ConnectError("protocol error: missing input message for unary method", Code.InvalidArgument);
  }
  if (body.length < ENVELOPE_HEADER_BYTES)
    throw new ConnectError("protocol error: incomplete envelope", Code.InvalidArgument);
  const size = body.readUInt32BE(1);
  const end = ENVELOPE_HEADER_BYTES + size;
  if (body.length < end) {
    throw new ConnectError(
      `protocol error: promised ${size} bytes, received ${body.length - ENVELOPE_HEADER_BYTES}`,
      Code.InvalidArgument,
    );
  }
  if (body.length > end) {
    throw new ConnectError("protocol error: received extra input message for unary method", Code.InvalidArgument);
  }
  if ((body[0] as number) & compressedFlag) {
    throw new ConnectError("protocol error: compressed message without grpc-encoding", Code.InvalidArgument);
  }
  return body.subarray(ENVELOPE_HEADER_BYTES, end);
}

function decode(message: Uint8Array): ModelInferRequest {
  try {
    return fromBinary(ModelInferRequestSchema, message);
  } catch (err) {
    throw new ConnectError(`parse binary: ${err instanceof Error ? err.message : String(err)}`, Code.InvalidArgument);
  }
}

/** How the fast path reads calls and answers them. */
export interface ModelInferHandlerOptions {
  /** Messages over it are refused, as Connect's readMaxBytes does. */
  readMaxBytes: number;
  /** Refuses calls that are not allowed (restricted APIs) before reading them. */
  refuse?: (headers: http2.IncomingHttpHeaders) => ConnectError | undefined;
  /** Response compression (default none). */
  compression?: ResponseCompressionLevel;
  /** The setting that raises readMaxBytes, named in its refusals. */
  maxInputFlag?: string;
}

/** The fast path for `infer` (see ModelInferHandlerOptions). */
export function grpcModelInferHandler(
  infer: ModelInferFn,
  { readMaxBytes, refuse, compression = "none", maxInputFlag }: ModelInferHandlerOptions,
): FastPath {
  const oversize = (size: number) => inputTooLarge(readMaxBytes, size, maxInputFlag);
  return (req, res) => {
    if (!servedHere(req)) return false;
    // Read only when compressing: the uncompressed default costs this path nothing.
    const algorithm =
      compression === "none"
        ? undefined
        : responseAlgorithm(compression, req.headers[headerAcceptEncoding.toLowerCase()] as string | undefined);
    const call: GrpcCallTimes = {
      readStartNs: nowNs(),
      readEndNs: 0,
      header: (name) => {
        const v = req.headers[name];
        return Array.isArray(v) ? v[0] : v;
      },
      headers: () => Object.entries(req.headers),
    };
    const controller = new AbortController();
    let answered = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = () => {
      answered = true;
      clearTimeout(timer);
    };
    const sent = () => {
      const trace = call.trace;
      if (!trace) return;
      trace.stamp("GRPC_SEND_END", nowNs());
      trace.end();
    };
    const fail = (err: unknown) => {
      if (answered) return;
      finish();
      call.trace?.stamp("GRPC_SEND_START");
      const error = toConnectError(err);
      controller.abort(error);
      const trailers: Record<string, string> = {};
      for (const [key, value] of setTrailerStatus(new Headers(), error)) trailers[key] = value;
      res.writeHead(200, { "content-type": contentTypeProto });
      res.addTrailers(withReadableGrpcMessage(trailers));
      res.end(sent);
      // Whatever the client is still sending is read and dropped.
      req.resume();
    };
    const answer = (response: ModelInferResponse) => {
      if (answered) return;
      call.trace?.stamp("GRPC_SEND_START");
      // Serialized before the call counts as answered, so a failure here still reaches the client.
      const message = toBinary(ModelInferResponseSchema, response);
      if (algorithm) {
        compressMessage(algorithm, message).then((compressed) => {
          if (answered) return;
          finish();
          res.writeHead(200, { "content-type": contentTypeProto, [headerEncoding.toLowerCase()]: algorithm });
          res.addTrailers({ "grpc-status": "0" });
          res.end(encodeEnvelope(compressedFlag, compressed), sent);
        }, fail);
        return;
      }
      finish();
      res.writeHead(200, { "content-type": contentTypeProto });
      res.addTrailers({ "grpc-status": "0" });
      res.end(encodeEnvelope(0, message), sent);
    };
    res.on("close", () => {
      if (answered) return;
      finish();
      controller.abort(new ConnectError("the client cancelled the call", Code.Canceled));
      call.trace?.end();
    });

    const timeout = parseTimeout(
      (req.headers[headerTimeout.toLowerCase()] as string | undefined) ?? null,
      Number.MAX_SAFE_INTEGER,
    );
    if (timeout.error) {
      fail(timeout.error);
      return true;
    }
    const refused = refuse?.(req.headers);
    if (refused) {
      fail(refused);
      return true;
    }
    if (timeout.timeoutMs !== undefined) {
      // The client stops waiting at its deadline; so does the call, and the stage hears of it through the signal.
      timer = deadlineTimer(timeout.timeoutMs, () =>
        fail(new ConnectError("the operation timed out", Code.DeadlineExceeded)),
      );
    }

    const chunks: Buffer[] = [];
    let received = 0;
    let declared: number | undefined;
    req.on("data", (chunk: Buffer) => {
      if (answered) return;
      received += chunk.length;
      chunks.push(chunk);
      // The envelope says how big the message is: refuse it as soon as its prefix is here (however
      // the client split it), before reading the message.
      if (declared === undefined && received >= ENVELOPE_HEADER_BYTES) {
        declared = (chunks.length === 1 ? chunk : Buffer.concat(chunks)).readUInt32BE(1);
        if (declared > readMaxBytes) return fail(oversize(declared));
      }
      if (received > ENVELOPE_HEADER_BYTES + readMaxBytes) fail(oversize(received - ENVELOPE_HEADER_BYTES));
    });
    req.on("end", () => {
      if (answered) return;
      call.readEndNs = nowNs();
      try {
        const request = decode(
          unaryMessage(chunks.length === 1 ? (chunks[0] as Buffer) : Buffer.concat(chunks, received)),
        );
        infer(request, controller.signal, call).then(answer).catch(fail);
      } catch (err) {
        fail(err);
      }
    });
    return true;
  };
}
