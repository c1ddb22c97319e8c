/**
 * RepositoryModelLoad's file count, checked before Connect decodes the message. Decoding a map
 * entry costs protobuf-es a few microseconds of the event loop: a load of 20,000 "file:"
 * parameters took 30-160 ms, one of a million (19 MB, well under the size cap) 3.6 s, during
 * which the server answered nothing. Here the call's message is read first, its parameters are
 * counted by walking the wire format's top-level fields (stopping past the limit), and a load
 * with too many is refused at once; any other goes on to Connect, its bytes put back on the
 * request stream as they came.
 */
import type http2 from "node:http2";
import { Code, ConnectError } from "@connectrpc/connect";
import { compressedFlag } from "@connectrpc/connect/protocol";
import {
  contentTypeProto,
  headerEncoding,
  parseContentType,
  setTrailerStatus,
} from "@connectrpc/connect/protocol-grpc";
import type { ModelLoadLimits } from "@trellis/kserve";
import { tooManyLoadFiles } from "@trellis/kserve";
import { type Coding, type DecompressionBudget, inflateWithin } from "@trellis/kserve/wire";
import { toConnectError } from "@trellis/stage/backend";
import { withReadableGrpcMessage } from "./model-infer.js";

export const REPOSITORY_MODEL_LOAD_PATH = "/inference.GRPCInferenceService/RepositoryModelLoad";
const ENVELOPE_HEADER_BYTES = 5;
/** RepositoryModelLoadRequest's fields: model_name = 2, parameters = 3 (one map entry each). */
const MODEL_NAME_FIELD = 2;
const PARAMETERS_FIELD = 3;

/** A varint at `at`: its value (up to 2^53) and where the next field starts; undefined past the end. */
function varint(bytes: Uint8Array, at: number): [number, number] | undefined {
  let value = 0;
  let scale = 1;
  for (let i = at; i < bytes.length && i < at + 10; i++) {
    const b = bytes[i] as number;
    value += (b & 0x7f) * scale;
    if (b < 0x80) return [value, i + 1];
    scale *= 128;
  }
  return undefined;
}

/**
 * The top-level fields of a RepositoryModelLoadRequest as the wire has them: how many parameters
 * (counting stops once past `stopAfter`) and the model's name. A malformed message is counted as
 * far as it reads: Connect refuses it when it decodes it.
 */
export function scanLoadRequest(message: Uint8Array, stopAfter: number): { parameters: number; modelName: string } {
  let parameters = 0;
  let modelName = "";
  let at = 0;
  while (at < message.length && parameters <= stopAfter) {
    const tag = varint(message, at);
    if (!tag) break;
    const [key, next] = tag;
    const field = Math.floor(key / 8);
    const wire = key % 8;
    if (wire === 0) {
      const skipped = varint(message, next);
      if (!skipped) break;
      at = skipped[1];
    } else if (wire === 1 || wire === 5) {
      at = next + (wire === 1 ? 8 : 4);
    } else if (wire === 2) {
      const length = varint(message, next);
      if (!length) break;
      const [size, start] = length;
      at = start + size;
      if (field === PARAMETERS_FIELD) parameters++;
      if (field === MODEL_NAME_FIELD && at <= message.length) {
        modelName = new TextDecoder().decode(message.subarray(start, at));
      }
    } else {
      break;
    }
  }
  return { parameters, modelName };
}

/** A binary gRPC call (not gRPC-Web, not Connect), with the coding its messages come in. */
function grpcCoding(req: http2.Http2ServerRequest): Coding | "identity" | undefined {
  const type = parseContentType(req.headers["content-type"] ?? null);
  if (!type?.binary) return undefined;
  const encoding = req.headers[headerEncoding.toLowerCase()] ?? "identity";
  return encoding === "identity" || encoding === "gzip" || encoding === "deflate" || encoding === "br"
    ? encoding
    : undefined;
}

/**
 * Reads the first envelope of `req` (its prefix and message, at most `maxBytes` of message) and
 * hands it to `done`, the bytes still on the stream for whoever reads it next (unshifted); with
 * `ended`, the stream ended first (the whole body read, no envelope complete).
 */
function readEnvelope(
  req: http2.Http2ServerRequest,
  maxBytes: number,
  done: (envelope: Buffer | undefined, ended: boolean) => void,
): void {
  const chunks: Buffer[] = [];
  let total = 0;
  let need: number | undefined;
  let finished = false;
  const finish = (ended: boolean) => {
    if (finished) return;
    finished = true;
    req.off("readable", onReadable);
    req.off("end", onEnd);
    const body = Buffer.concat(chunks, total);
    if (!ended && total > 0) req.unshift(body);
    done(need !== undefined && total >= need ? body.subarray(0, need) : undefined, ended);
  };
  const onReadable = () => {
    for (let chunk = req.read() as Buffer | null; chunk !== null; chunk = req.read() as Buffer | null) {
      chunks.push(chunk);
      total += chunk.byteLength;
      if (need === undefined && total >= ENVELOPE_HEADER_BYTES) {
        const size = Buffer.concat(chunks, total).readUInt32BE(1);
        // Over the size cap: Connect refuses it from the prefix.
        if (size > maxBytes) return finish(false);
        need = ENVELOPE_HEADER_BYTES + size;
      }
      if (need !== undefined && total >= need) return finish(false);
    }
  };
  const onEnd = () => finish(true);
  req.on("readable", onReadable);
  req.on("end", onEnd);
}

/** Answers the call with `err` (trailers only), reading and dropping what the client still sends. */
function answerError(req: http2.Http2ServerRequest, res: http2.Http2ServerResponse, err: unknown): void {
  const trailers: Record<string, string> = {};
  for (const [key, value] of setTrailerStatus(new Headers(), toConnectError(err))) trailers[key] = value;
  res.writeHead(200, { "content-type": contentTypeProto });
  res.addTrailers(withReadableGrpcMessage(trailers));
  res.end();
  req.resume();
}

export interface LoadGuardOptions {
  limits: ModelLoadLimits;
  /** Largest message (--grpc-max-input-size): a larger one is left to Connect to refuse. */
  maxBytes: number;
  budget?: DecompressionBudget;
  /** Why the call may not load models at all (a restricted endpoint group): refused before reading it. */
  refuse?: (headers: http2.IncomingHttpHeaders) => ConnectError | undefined;
}

/**
 * For a gRPC RepositoryModelLoad call: reads its message, refuses it (INVALID_ARGUMENT naming
 * --max-load-files) when it carries more parameters than file overrides allowed plus its config,
 * else calls `next` with the message back on the stream. Returns false (nothing read) for other calls.
 */
export function guardRepositoryLoad(
  req: http2.Http2ServerRequest,
  res: http2.Http2ServerResponse,
  { limits, maxBytes, budget, refuse }: LoadGuardOptions,
  next: () => void,
): boolean {
  if (req.method !== "POST" || req.url !== REPOSITORY_MODEL_LOAD_PATH) return false;
  const coding = grpcCoding(req);
  if (coding === undefined) return false;
  const refused = refuse?.(req.headers);
  if (refused) {
    answerError(req, res, refused);
    return true;
  }
  readEnvelope(req, maxBytes, (envelope, ended) => {
    if (ended) {
      // The body ended before a whole message: nothing is left on the stream for Connect to read.
      const why = envelope === undefined ? "incomplete envelope" : "the body ended";
      answerError(req, res, new ConnectError(`protocol error: ${why}`, Code.InvalidArgument));
      return;
    }
    // Over the size cap: Connect refuses it from its prefix.
    if (!envelope) return next();
    const message = envelope.subarray(ENVELOPE_HEADER_BYTES);
    const compressed = ((envelope[0] as number) & compressedFlag) !== 0 && coding !== "identity";
    // Beside the files, "config" (other parameters count too: they cost as much to decode).
    const check = (plain: Uint8Array) => {
      const { parameters, modelName } = scanLoadRequest(plain, limits.maxFiles + 1);
      if (parameters > limits.maxFiles + 1) throw tooManyLoadFiles(modelName, undefined, limits.maxFiles);
    };
    const checked = compressed
      ? inflateWithin(coding, message, maxBytes, budget).then(check)
      : Promise.resolve(message).then(check);
    // A message that does not inflate (or not within the budget) is Connect's to answer, as it does.
    checked.then(next, (err: unknown) => (err instanceof ConnectError ? answerError(req, res, err) : next()));
  });
  return true;
}
