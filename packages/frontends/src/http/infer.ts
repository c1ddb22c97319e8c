/**
 * The HTTP/REST frontend's inference routes over the shared infer path (../infer.ts): POST
 * /v2/models/m[/versions/v]/infer, with JSON tensors or Triton's binary tensor extension (and
 * shared memory), and the generate extension's /generate and /generate_stream. Here is only
 * the wire: the request decoded from its body, the answer encoded with its headers.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { promisify } from "node:util";
import { constants, deflate, gzip, type ZlibOptions } from "node:zlib";
import { acquireModel, clientError, type HeldModel, inferOptionsFromParameters, shownValue } from "@trellis/kserve";
import {
  type SharedMemoryRef,
  type SystemSharedMemory,
  sharedMemoryNotTaken,
  sharedMemoryOutputParameters,
  sharedMemoryRef,
  tensorToRaw,
  withoutSharedMemory,
} from "@trellis/kserve/wire";
import type { ModelConfig } from "@trellis/protocol";
import {
  Code,
  datatypeFromConfig,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  nowNs,
  type Parameters,
  type RequestedOutput,
  type RequestTrace,
  StageError,
  type Tensor,
} from "@trellis/stage";
import { elementSize, requestPrefix } from "@trellis/stage/backend";
import { forwardedHeaders, withForwardedHeaders } from "../header-forwarding.js";
import { type DecodedInfer, type InferCall, inferAnswers, inferOnce } from "../infer.js";
import { badRequest, headerOf, parseJson, parseObject, sendError, sendJson } from "./body.js";
import type { Exchange, RestFrontend } from "./context.js";
import { generateAnswer, generateRequest } from "./generate.js";
import {
  type JsonInferRequest,
  type JsonTensor,
  LongIntegerSeen,
  parametersFromJson,
  parseExactJson,
  stringifyJson,
  tensorFromBinary,
  tensorFromJson,
  tensorToJsonData,
} from "./json.js";

const HEADER_LENGTH = "inference-header-content-length";

/** The binary extension's JSON header length: Triton's header, or with `mime`, the content type's tail. */
function binaryHeaderLength(req: IncomingMessage, mime: string | undefined): string | undefined {
  if (!mime) {
    const length = headerOf(req, HEADER_LENGTH);
    // A decimal byte count only: not hex ("0x62"), a fraction or padding, which Number() would take.
    if (length !== undefined && !/^\d+$/.test(length)) {
      throw badRequest(`Unable to parse inference header size, got: ${length}`);
    }
    return length;
  }
  const contentType = req.headers["content-type"] ?? "";
  if (contentType.startsWith(mime)) {
    const size = contentType.slice(mime.length);
    if (!/^\d+$/.test(size)) throw badRequest(`Unable to parse inference header size, got: ${size}`);
    return size;
  }
  if (contentType.includes(mime)) {
    throw badRequest(`expect MIME type for binary data starts with '${mime}', got: ${contentType}`);
  }
  return undefined;
}

/**
 * The coding to compress an inference response with, from Accept-Encoding (tritonclient.http's
 * response_compression_algorithm): gzip or deflate, the client's highest q first; none by default.
 */
function responseEncoding(accept: string | undefined): "gzip" | "deflate" | undefined {
  let best: { coding: "gzip" | "deflate"; q: number } | undefined;
  for (const part of (accept ?? "").split(",")) {
    const [name = "", ...params] = part.split(";").map((x) => x.trim().toLowerCase());
    const coding = name === "gzip" || name === "x-gzip" ? "gzip" : name === "deflate" ? "deflate" : undefined;
    if (!coding) continue;
    const qParam = params.find((p) => p.startsWith("q="));
    const q = qParam ? Number(qParam.slice(2)) : 1;
    if (!(q > 0)) continue;
    if (!best || q > best.q) best = { coding, q };
  }
  return best?.coding;
}

const gzipAsync = promisify(gzip);
const deflateAsync = promisify(deflate);
// Tensors are mostly incompressible floats: the fastest level keeps the cost down.
const RESPONSE_COMPRESSION: ZlibOptions = { level: constants.Z_BEST_SPEED };
/**
 * The largest infer answer compressed by default: 32 MiB of random floats take 1.1 s of CPU at
 * gzip's fastest level, 4 MiB 0.14 s (`zlib.gzipSync` on a 2-core EPYC); JSON answers of that size are rare.
 */
export const DEFAULT_HTTP_MAX_COMPRESSED_ANSWER_BYTES = 4 * 1024 * 1024;

/** When a request's body arrived, and its trace once the infer path begins one (it is sampled). */
interface Receipt {
  startNs: number;
  endNs: number;
  trace?: RequestTrace;
}

const receipt = (): Receipt => ({ startNs: nowNs(), endNs: 0 });

/** The infer call for an HTTP request: its model, a signal that aborts when the client goes away, tracing. */
function httpCall(x: Exchange, received: Receipt): InferCall {
  const { rest, req, res } = x;
  const [, model = "", version = ""] = x.match;
  const abort = new AbortController();
  res.on("close", () => {
    if (!res.writableFinished) abort.abort(new StageError(Code.Canceled, model, "client closed the connection"));
  });
  return {
    registry: rest.registry,
    model,
    version,
    signal: abort.signal,
    tracing: rest.ctx.tracing,
    bytesInFlight: rest.ctx.bytesInFlight,
    header: (h) => headerOf(req, h),
    withheld: rest.withheld,
    // A sampled request's receipt stamped; its send end stamped and the trace ended as the answer goes.
    traced: (trace: RequestTrace) => {
      received.trace = trace;
      trace.stamp("HTTP_RECV_START", received.startNs);
      trace.stamp("HTTP_RECV_END", received.endNs);
      res.once("finish", () => trace.stamp("HTTP_SEND_END", nowNs()));
      res.once("close", () => trace.end());
    },
  };
}

/** The request's parameters with its forwarded headers (--http-header-forward-pattern) joining them. */
function withForwarded({ ctx }: RestFrontend, req: IncomingMessage, parameters: Parameters | undefined) {
  return ctx.forwardHeaders
    ? withForwardedHeaders(parameters, forwardedHeaders(ctx.forwardHeaders, Object.entries(req.headers)))
    : parameters;
}

/** The model's name from the path, for errors that name it. */
const modelOf = (x: Exchange) => x.match[1] ?? "";

/**
 * POST /v2/models/m[/versions/v]/infer. Triton answers an infer on an unknown or unavailable
 * model with its error's code: 404 for one not found (http_server.cc HandleInfer since server
 * PR #6713), 503 for a version not ready. As Triton's handler does, the model is looked up once,
 * before the upload, and held until its answer is made: an unload or reload of that version
 * waits for the request, which is answered by the version it found.
 */
export async function inferRoute(x: Exchange): Promise<void> {
  const { rest, req, res } = x;
  const received = receipt();
  let held: HeldModel;
  try {
    held = acquireModel(rest.registry, modelOf(x), x.match[2] ?? "");
  } catch (err) {
    return sendError(res, err, rest.withheld);
  }
  let answer: InferAnswer;
  try {
    const body = await rest.body(req);
    received.endNs = nowNs();
    const decoded = decodeInfer({ rest, req, body, model: modelOf(x), config: held.stage.config, received });
    const call = httpCall(x, received);
    call.stage = held.stage;
    answer = await inferOnce(call, () => decoded);
  } finally {
    held.release();
  }
  await sendInferAnswer(
    req,
    res,
    answer,
    rest.ctx.maxCompressedAnswerBytes ?? DEFAULT_HTTP_MAX_COMPRESSED_ANSWER_BYTES,
  );
}

/** An infer request body: the JSON header and the binary section after it. */
interface InferBody {
  rest: RestFrontend;
  req: IncomingMessage;
  body: Buffer;
  /** The model the path names (errors name it). */
  model: string;
  /** Its config, from which a raw binary request's one input is deduced. */
  config: ModelConfig;
  received: Receipt;
}

/**
 * The body's JSON header and binary section, split where the binary extension's header length
 * says; undefined for a raw binary request (a header length of 0: the whole body is the one
 * input's bytes, no JSON at all).
 */
function splitBody(
  { rest, req, body }: InferBody,
  exact: boolean,
): { json: JsonInferRequest; binary: Uint8Array } | undefined {
  const headerLength = binaryHeaderLength(req, rest.ctx.binaryMime);
  let jsonPart: Uint8Array = body;
  let binary: Uint8Array = new Uint8Array(0);
  if (headerLength !== undefined) {
    const n = Number(headerLength);
    if (!Number.isInteger(n) || n < 0 || n > body.byteLength) {
      throw badRequest(
        `Inference-Header-Content-Length ${headerLength} is not within the ${body.byteLength}-byte body`,
      );
    }
    if (n === 0 && !rest.ctx.binaryMime) return undefined;
    jsonPart = body.subarray(0, n);
    binary = body.subarray(n);
  }
  const parse = exact ? parseExactJson : undefined;
  const json = parseObject(jsonPart, "inference request", parse) as unknown as JsonInferRequest;
  if (!Array.isArray(json.inputs)) throw badRequest("request has no 'inputs' array");
  if (json.outputs !== undefined && !Array.isArray(json.outputs)) throw badRequest("'outputs' must be an array");
  return { json, binary };
}

/**
 * A raw binary request's one input, its name, datatype and shape deduced from the model's config
 * as Triton's core does (infer_request.cc Normalize): only for a model of one input, with at most
 * one variable-sized dimension (its size from the byte count), BYTES only for one element (the
 * body is that element, without a length prefix). Refused with Triton's texts.
 */
function rawInput(config: ModelConfig, model: string, body: Uint8Array): Tensor {
  const prefix = requestPrefix(undefined);
  if (config.input.length !== 1) {
    throw badRequest(
      `${prefix}Raw request must only have 1 input (found 1) to be deduced but got ${config.input.length} inputs in '${model}' model configuration`,
    );
  }
  const input = config.input[0] as ModelConfig["input"][number];
  const shape: number[] = config.maxBatchSize !== 0 ? [1] : [];
  let dynamicAxis = -1;
  let known = 1;
  for (const d of input.dims.map(Number)) {
    if (d === -1) {
      if (dynamicAxis !== -1) {
        throw badRequest(
          `${prefix}The shape of the raw input '${input.name}' can not be deduced because there are more than one variable-sized dimension`,
        );
      }
      dynamicAxis = shape.length;
    } else {
      known *= d;
    }
    shape.push(d);
  }
  const datatype = datatypeFromConfig(input.dataType);
  if (datatype === "BYTES") {
    if (dynamicAxis !== -1 || known !== 1) {
      throw badRequest(`${prefix}For BYTE datatype raw input '${input.name}', the model must have input shape [1]`);
    }
    return { name: input.name, datatype, shape, data: [body] };
  }
  if (dynamicAxis !== -1) shape[dynamicAxis] = Math.floor(body.byteLength / known / elementSize(datatype));
  return tensorFromBinary({ name: input.name, datatype, shape }, body, model);
}

/** The answer to an infer request as it goes back: JSON header, binary outputs after it. */
interface InferAnswer {
  head: Buffer;
  chunks: Uint8Array[];
  binaryMime: string | undefined;
}

/**
 * An infer request's body as the stage's request: its inputs (JSON data, a slice of the binary
 * section, or a shared memory region), requested outputs, and parameters (Triton's typed ones
 * refused when of the wrong type, never ignored), with how its answer is encoded.
 */
function decodeInfer(body: InferBody): DecodedInfer<InferAnswer> {
  try {
    return decodeInferAs(body, false);
  } catch (err) {
    // An INT64/UINT64 value past 2^53, which JSON.parse rounded: the body read again, exactly.
    if (err instanceof LongIntegerSeen) return decodeInferAs(body, true);
    throw err;
  }
}

/** decodeInfer with the body's JSON read by JSON.parse, or `exact`ly (64-bit integers as bigints). */
function decodeInferAs(body: InferBody, exact: boolean): DecodedInfer<InferAnswer> {
  const split = splitBody(body, exact);
  const shared = body.rest.ctx.sharedMemory;
  if (!split) {
    // A raw binary request: every output comes back binary (Triton's default for it).
    const request: InferRequest = {
      inputs: [rawInput(body.config, body.model, body.body)],
      parameters: withForwarded(body.rest, body.req, undefined),
    };
    const placing: OutputPlacing = { binaryOutputs: new Map(), shmOutputs: new Map(), binaryDefault: true };
    return { request, options: {}, encode: encoderOf(body, placing) };
  }
  const { json, binary } = split;
  const inputs = decodeInputs({ json, binary, model: body.model, sharedMemory: shared, exact });
  const params = parametersFromJson(json.parameters, "request") ?? {};
  // Read from the request's own parameters, before forwarded headers join them.
  const options: InferOptions = inferOptionsFromParameters(params);
  const { binary_data_output: binaryDefault, priority: _p, timeout: _t, ...stageParams } = params;
  if (binaryDefault !== undefined && typeof binaryDefault !== "boolean") {
    throw badRequest(`request parameter 'binary_data_output' must be a boolean, got ${shownValue(binaryDefault)}`);
  }
  const wanted = decodeOutputs(json, shared);
  const request: InferRequest = {
    id: typeof json.id === "string" && json.id ? json.id : undefined,
    inputs,
    outputs: wanted.outputs,
    parameters: withForwarded(body.rest, body.req, Object.keys(stageParams).length > 0 ? stageParams : undefined),
  };
  const placing: OutputPlacing = { ...wanted, binaryDefault: binaryDefault === true, sharedMemory: shared };
  return { request, options, encode: encoderOf(body, placing) };
}

/** How a request's answers are encoded, stamped on its trace as they go. */
function encoderOf(body: InferBody, placing: OutputPlacing) {
  return (response: InferResponse) => {
    body.received.trace?.stamp("HTTP_SEND_START");
    return encodeInfer(response, placing, body.rest);
  };
}

/** Each input as a tensor: JSON data, its slice of the binary section, or a shared memory region. */
function decodeInputs({
  json,
  binary,
  model,
  sharedMemory,
  exact,
}: {
  json: JsonInferRequest;
  binary: Uint8Array;
  model: string;
  sharedMemory: SystemSharedMemory | undefined;
  exact: boolean;
}): Tensor[] {
  // For Triton's byte-size refusal, which names the model and the request's id.
  const requestId = typeof json.id === "string" ? json.id : undefined;
  let offset = 0;
  const inputs = json.inputs.map((t: JsonTensor) => {
    if (typeof t !== "object" || t === null || Array.isArray(t)) {
      throw badRequest(`every input must be a JSON object, got ${shownValue(t)}`);
    }
    if (typeof t.name !== "string") throw badRequest("every input needs a string 'name'");
    const shm = sharedMemoryRef(parametersFromJson(t.parameters, `input '${t.name}'`), `input '${t.name}'`);
    if (shm) {
      if (!sharedMemory) throw sharedMemoryNotTaken();
      if (t.data !== undefined) throw badRequest(`input '${t.name}': data and shared memory are both given`);
      return tensorFromBinary(t, sharedMemory.read(shm, `input '${t.name}'`), model, requestId);
    }
    const size = t.parameters?.binary_data_size;
    if (size === undefined) return tensorFromJson(t, exact);
    if (!Number.isSafeInteger(size) || (size as number) < 0) {
      throw badRequest(`input '${t.name}': binary_data_size must be a byte count, got ${shownValue(size)}`);
    }
    const end = offset + (size as number);
    if (end > binary.byteLength) {
      throw badRequest(
        `input '${t.name}': binary_data_size ${size} runs past the ${binary.byteLength}-byte binary section (at offset ${offset})`,
      );
    }
    const tensor = tensorFromBinary(t, binary.subarray(offset, end), model, requestId);
    offset = end;
    return tensor;
  });
  if (offset !== binary.byteLength) {
    throw badRequest(
      `unexpected additional input data: ${binary.byteLength - offset} binary bytes not claimed by any input`,
    );
  }
  return inputs;
}

/** Where each output goes back: in the binary section, as JSON data, or into a shared memory region. */
interface OutputPlacing {
  binaryOutputs: Map<string, boolean>;
  shmOutputs: Map<string, SharedMemoryRef>;
  /**
   * How an output the request does not list comes back: the request's binary_data_output
   * (Triton's default output kind); a listed output is binary only by its own binary_data.
   */
  binaryDefault: boolean;
  sharedMemory?: SystemSharedMemory | undefined;
}

/** The requested outputs, and for each, binary_data and a shared memory region taken off its parameters. */
function decodeOutputs(
  json: JsonInferRequest,
  sharedMemory: SystemSharedMemory | undefined,
): { outputs: RequestedOutput[] | undefined } & Omit<OutputPlacing, "binaryDefault" | "sharedMemory"> {
  const binaryOutputs = new Map<string, boolean>();
  const shmOutputs = new Map<string, SharedMemoryRef>();
  const outputs = json.outputs?.map((o) => {
    if (typeof o?.name !== "string") throw badRequest("every output needs a string 'name'");
    const p = parametersFromJson(o.parameters, `output '${o.name}'`) ?? {};
    const shm = sharedMemoryRef(p, `output '${o.name}'`);
    if (shm) {
      if (!sharedMemory) throw sharedMemoryNotTaken();
      shmOutputs.set(o.name, shm);
    }
    const { binary_data: bin, ...rest } = withoutSharedMemory(p) ?? {};
    if (bin !== undefined && typeof bin !== "boolean") {
      throw badRequest(`output '${o.name}': parameter 'binary_data' must be a boolean, got ${shownValue(bin)}`);
    }
    // Listed: binary only when it says so itself, whatever the request-level flag (as Triton).
    binaryOutputs.set(o.name, bin === true);
    return Object.keys(rest).length > 0 ? { name: o.name, parameters: rest as Parameters } : { name: o.name };
  });
  return { outputs, binaryOutputs, shmOutputs };
}

/** The stage's answer as the JSON header and binary section the client asked for (shared memory outputs written). */
function encodeInfer(response: InferResponse, placing: OutputPlacing, rest: RestFrontend): InferAnswer {
  const chunks: Uint8Array[] = [];
  const outputs = response.outputs.map((t) => {
    const shm = placing.shmOutputs.get(t.name);
    if (shm && placing.sharedMemory) {
      const raw = tensorToRaw(t);
      placing.sharedMemory.write(shm, raw, `output '${t.name}'`);
      const parameters = sharedMemoryOutputParameters(shm, raw.byteLength);
      return { name: t.name, datatype: t.datatype, shape: t.shape, parameters };
    }
    if (placing.binaryOutputs.get(t.name) ?? placing.binaryDefault) {
      const raw = tensorToRaw(t);
      chunks.push(raw);
      return { name: t.name, datatype: t.datatype, shape: t.shape, parameters: { binary_data_size: raw.byteLength } };
    }
    return { name: t.name, datatype: t.datatype, shape: t.shape, data: tensorToJsonData(t) };
  });
  const head = Buffer.from(
    stringifyJson({
      ...(response.id ? { id: response.id } : {}),
      model_name: response.modelName,
      model_version: response.modelVersion,
      ...(response.parameters && Object.keys(response.parameters).length > 0
        ? { parameters: response.parameters }
        : {}),
      outputs,
    }),
  );
  return { head, chunks, binaryMime: rest.ctx.binaryMime };
}

/**
 * Sends an infer answer: JSON alone, or JSON and binary outputs; compressed when the client
 * accepts it and the answer is at most `maxCompressedBytes`.
 */
async function sendInferAnswer(
  req: IncomingMessage,
  res: ServerResponse,
  answer: InferAnswer,
  maxCompressedBytes: number,
): Promise<void> {
  const { head, chunks, binaryMime } = answer;
  let total = head.byteLength;
  for (const c of chunks) total += c.byteLength;
  const headers: Record<string, string | number> =
    chunks.length === 0
      ? { "content-type": "application/json" }
      : binaryMime
        ? { "content-type": `${binaryMime}${head.byteLength}` }
        : { "content-type": "application/octet-stream", [HEADER_LENGTH]: head.byteLength };
  const coding = total <= maxCompressedBytes ? responseEncoding(req.headers["accept-encoding"]) : undefined;
  if (coding) {
    // Inference-Header-Content-Length stays the uncompressed header's length: clients
    // (tritonclient.http's InferResult) decompress the body first, then split it.
    const whole = chunks.length === 0 ? head : Buffer.concat([head, ...chunks]);
    const body = await (coding === "gzip" ? gzipAsync : deflateAsync)(whole, RESPONSE_COMPRESSION);
    res.writeHead(200, {
      ...headers,
      "content-encoding": coding,
      vary: "Accept-Encoding",
      "content-length": body.byteLength,
    });
    res.end(body);
    return;
  }
  res.writeHead(200, { ...headers, "content-length": total });
  res.write(head);
  for (const c of chunks) res.write(c);
  res.end();
}

/**
 * Triton's generate extension (see generate.ts). /generate answers once, as JSON; a decoupled
 * model must send exactly one response there. /generate_stream answers with Server-Sent Events,
 * one "data:" event per response; a failure before the first is an ordinary error answer, one
 * after it an {"error": ...} event, since the status has gone out with the first.
 */
export async function generateRoute(x: Exchange, streaming: boolean): Promise<void> {
  const { rest, req } = x;
  const stage = rest.registry.resolve(modelOf(x), x.match[2] ?? "");
  const received = receipt();
  const body = parseJson(await rest.body(req), "generate request");
  received.endNs = nowNs();
  const call = httpCall(x, received);
  // The model looked up once, before the body, and run as it was then.
  call.stage = stage;
  const metadata = await stage.metadata();
  const { answers } = inferAnswers(call, () => {
    const request = generateRequest(body, metadata, stage.config.maxBatchSize > 0);
    request.parameters = withForwarded(rest, req, request.parameters);
    return { request, options: {}, encode: generateAnswer };
  });
  const generated = { answers, trace: received.trace, signal: call.signal };
  return streaming ? streamGenerated(x, generated) : sendGenerated(x, generated);
}

interface Generated {
  answers: AsyncGenerator<Record<string, unknown>>;
  trace: RequestTrace | undefined;
  /** Aborted when the client goes away. */
  signal: AbortSignal;
}

async function sendGenerated({ res, match }: Exchange, { answers, trace }: Generated): Promise<void> {
  const all: Record<string, unknown>[] = [];
  for await (const answer of answers) all.push(answer);
  if (all.length !== 1) {
    throw new StageError(
      Code.InvalidArgument,
      match[1] ?? "",
      `generate answers with one response, and the model sent ${all.length}: use generate_stream`,
    );
  }
  trace?.stamp("HTTP_SEND_START");
  sendJson(res, 200, all[0]);
}

async function streamGenerated({ rest, res }: Exchange, { answers, trace, signal }: Generated): Promise<void> {
  const event = (answer: unknown) => `data: ${stringifyJson(answer)}\n\n`;
  try {
    for await (const answer of answers) {
      // The client went away: stop the model's responses (its iterator is returned).
      if (signal.aborted) break;
      if (!res.headersSent) {
        trace?.stamp("HTTP_SEND_START");
        res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" });
      }
      res.write(event(answer));
    }
  } catch (err) {
    if (!res.headersSent) throw err;
    res.write(event({ error: clientError(err, rest.withheld).rawMessage }));
  }
  if (!res.headersSent) res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8" });
  res.end();
}
