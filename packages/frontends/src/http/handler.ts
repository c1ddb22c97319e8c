/**
 * The KServe v2 HTTP/REST frontend with Triton's extensions (binary tensor
 * data, classification, statistics, model repository). Plain node:http: the
 * route table is small and fixed.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { promisify } from "node:util";
import { constants, deflate, gzip, type ZlibOptions } from "node:zlib";
import { toJson } from "@bufbuild/protobuf";
import {
  checkLoadFilesInJson,
  clientError,
  inferOptionsFromParameters,
  type ModelRegistry,
  normalizedModelConfig,
  shownValue,
} from "@trellis/kserve";
import {
  type DecompressionBudget,
  DecompressionBudgetExhausted,
  inflateWithin,
  type SharedMemoryRef,
  type SystemSharedMemory,
  sharedMemoryNotTaken,
  sharedMemoryOutputParameters,
  sharedMemoryRef,
  withoutSharedMemory,
} from "@trellis/kserve/wire";
import { type ModelConfig, ModelStatisticsSchema, modelConfigToJson } from "@trellis/protocol";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  nowNs,
  type Parameters,
  type RequestedOutput,
  type RequestTrace,
  StageError,
} from "@trellis/stage";
import { answersOf } from "@trellis/stage/backend";
import {
  loadModel,
  logSetting,
  modelReady,
  registerSharedMemory,
  repositoryIndex,
  serverReady,
  sharedMemoryRegions,
  statisticsStage,
  traceSetting,
  unloadModel,
  unregisterSharedMemory,
} from "../control.js";
import { forwardedHeaders, withForwardedHeaders } from "../header-forwarding.js";
import type { LogSettingsControl } from "../log-settings.js";
import { type ApiCategory, type ApiRestrictions, restrictionError } from "../restrictions.js";
import type { TraceControl } from "../trace-settings.js";
import { generateAnswer, generateRequest } from "./generate.js";
import {
  type JsonInferRequest,
  parametersFromJson,
  stringifyJson,
  tensorFromBinary,
  tensorFromJson,
  tensorToJsonData,
  tensorToRaw,
} from "./json.js";

export interface RestContext {
  registry: ModelRegistry;
  serverName: string;
  serverVersion: string;
  extensions: string[];
  /** Failed requests at debug; error detail withheld from a client (paths, addresses) at warn. */
  logger: { debug(obj: object, msg?: string): void; warn?(obj: object, msg?: string): void };
  /** Largest request body accepted (default DEFAULT_HTTP_MAX_INPUT_BYTES). */
  maxInputBytes?: number;
  /** The server-wide bound on decompressed bodies held at once (--max-inflight-decompressed-bytes); past it, 429. */
  decompressionBudget?: DecompressionBudget;
  /** The logging extension (/v2/logging); without it the route answers 501. */
  logSettings?: LogSettingsControl;
  /** Endpoint groups that require a header (tritonserver's --http-restricted-api); refused with 403. */
  restrictions?: ApiRestrictions;
  /** The trace extension (/v2[/models/m]/trace/setting) and request tracing; without it tracing stays OFF. */
  tracing?: TraceControl;
  /** System shared memory regions clients may register (--allow-client-shm); without it, none can be. */
  sharedMemory?: SystemSharedMemory;
  /** Headers of infer requests whose names match become request parameters (--http-header-forward-pattern). */
  forwardHeaders?: RegExp;
  /**
   * The binary tensor extension's JSON header length travels in the content type, `<binaryMime><n>`,
   * both ways, instead of Inference-Header-Content-Length: as the SageMaker and Vertex AI endpoints
   * take it, those platforms passing bodies through without Triton's own header.
   */
  binaryMime?: string;
}

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

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const HEADER_LENGTH = "inference-header-content-length";

export function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = stringifyJson(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}

/** The binary extension's JSON header length: Triton's header, or with `mime`, the content type's tail. */
function binaryHeaderLength(req: IncomingMessage, mime: string | undefined): string | undefined {
  if (!mime) {
    const header = req.headers[HEADER_LENGTH];
    const length = Array.isArray(header) ? header[0] : header;
    // A decimal byte count only: not hex ("0x62"), a fraction or padding, which Number() would take.
    if (length !== undefined && !/^\d+$/.test(length)) {
      throw new StageError(Code.InvalidArgument, "", `Unable to parse inference header size, got: ${length}`);
    }
    return length;
  }
  const contentType = req.headers["content-type"] ?? "";
  if (contentType.startsWith(mime)) {
    const size = contentType.slice(mime.length);
    if (!/^\d+$/.test(size)) {
      throw new StageError(Code.InvalidArgument, "", `Unable to parse inference header size, got: ${size}`);
    }
    return size;
  }
  if (contentType.includes(mime)) {
    throw new StageError(
      Code.InvalidArgument,
      "",
      `expect MIME type for binary data starts with '${mime}', got: ${contentType}`,
    );
  }
  return undefined;
}

function sendEmpty(res: ServerResponse, status: number): void {
  res.writeHead(status, { "content-length": 0 });
  res.end();
}

/** Logs error detail withheld from a client (see clientError), when there is a logger for it. */
type Withheld = ((detail: string, sent: string) => void) | undefined;

function sendError(res: ServerResponse, err: unknown, status?: number, withheld?: Withheld): void {
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
  sendJson(res, status ?? httpStatus(ce.code), { error: ce.rawMessage });
}

const badRequest = (message: string) => new StageError(Code.InvalidArgument, "", message);

/** A JSON body that must be an object (an empty body is an empty object). */
function parseObject(bytes: Uint8Array, what: string): Record<string, unknown> {
  const body = parseJson(bytes, what);
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw badRequest(`the ${what} must be a JSON object, got ${shownValue(body)}`);
  }
  return body as Record<string, unknown>;
}

/** A request's `parameters`: absent, or a JSON object. */
function parametersObject(body: Record<string, unknown>, what: string): Record<string, unknown> {
  const parameters = body.parameters;
  if (parameters === undefined) return {};
  if (typeof parameters !== "object" || parameters === null || Array.isArray(parameters)) {
    throw badRequest(`${what}: 'parameters' must be a JSON object, got ${shownValue(parameters)}`);
  }
  return parameters as Record<string, unknown>;
}

/** A trace setting's value: a string, number or boolean, a list of them, or null (back to the default). */
function traceSettingValue(key: string, v: unknown): string[] {
  const scalar = (x: unknown) => typeof x === "string" || typeof x === "number" || typeof x === "boolean";
  if (v === null) return [];
  if (scalar(v)) return [String(v)];
  if (Array.isArray(v) && v.every(scalar)) return v.map(String);
  throw badRequest(`trace setting '${key}' must be a string, a number, a list of them or null, got ${shownValue(v)}`);
}

/** Triton's default --http-max-input-size: 64 MiB. */
export const DEFAULT_HTTP_MAX_INPUT_BYTES = 64 * 1024 * 1024;

/**
 * The request body, refused (400, as Triton does) once it passes `maxBytes`, before it is all
 * buffered, and decompressed when it comes with a Content-Encoding (tritonclient.http's
 * request_compression_algorithm sends gzip or deflate); the decompressed body has the same limit.
 */
async function readBody(req: IncomingMessage, maxBytes: number, budget?: DecompressionBudget): Promise<Buffer> {
  const tooLarge = (size: string, what = "request body") =>
    new StageError(
      Code.InvalidArgument,
      "",
      `${what} of ${size} bytes exceeds the maximum allowed value of ${maxBytes} bytes; use --http-max-input-size to increase the limit`,
    );
  const encoding = contentEncoding(req);
  const declared = Number(req.headers["content-length"] ?? 0);
  if (declared > maxBytes) throw tooLarge(String(declared));
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of req) {
    total += (chunk as Buffer).byteLength;
    if (total > maxBytes) throw tooLarge(`more than ${maxBytes}`);
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
      throw tooLarge(`more than ${maxBytes}`, `${encoding}-decompressed request body`);
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
// Tensors are mostly incompressible floats: the fastest level keeps the cost near a copy.
const RESPONSE_COMPRESSION: ZlibOptions = { level: constants.Z_BEST_SPEED };

function parseJson(bytes: Uint8Array, what: string): unknown {
  if (bytes.byteLength === 0) return {};
  try {
    return JSON.parse(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("utf8"));
  } catch (err) {
    throw new StageError(Code.InvalidArgument, "", `failed to parse the ${what} JSON: ${(err as Error).message}`);
  }
}

/** int64 fields that protobuf JSON writes as strings but Triton writes as numbers. */
const INT64_KEYS = new Set([
  "dims",
  "shape",
  "versions",
  "model_version",
  "max_queue_delay_microseconds",
  "default_timeout_microseconds",
  "max_sequence_idle_microseconds",
  "count",
  "ns",
  "last_inference",
  "inference_count",
  "execution_count",
  "batch_size",
]);

function numbersForInt64(value: unknown, key = ""): unknown {
  if (Array.isArray(value)) return value.map((v) => numbersForInt64(v, key));
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, numbersForInt64(v, k)]));
  }
  if (typeof value === "string" && INT64_KEYS.has(key) && /^-?\d+$/.test(value)) return Number(value);
  return value;
}

/** A model's config as Triton answers GET .../config: normalized, in ModelConfigToJson's JSON. */
export function configToJson(config: ModelConfig): unknown {
  return modelConfigToJson(normalizedModelConfig(config));
}

const MODEL_ROUTE =
  /^\/v2\/models\/([^/]+)(?:\/versions\/([^/]+))?(?:\/(ready|config|stats|infer|generate|generate_stream))?$/;
const SHARED_MEMORY_ROUTE = /^\/v2\/(system|cuda)sharedmemory(?:\/region\/([^/]+))?\/(status|register|unregister)$/;
const TRACE_ROUTE = /^\/v2\/(?:models\/([^/]+)\/)?trace\/setting$/;
const REPO_ROUTE = /^\/v2\/repository\/models\/([^/]+)\/(load|unload)$/;

const headerOf = (req: IncomingMessage, name: string): string | undefined => {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
};

/** The restricted-API group of a REST path (undefined for paths that are no endpoint). */
function httpCategory(path: string): ApiCategory | undefined {
  if (path === "/v2" || path === "/v2/") return "metadata";
  if (path.startsWith("/v2/health/")) return "health";
  if (path === "/v2/models/stats") return "statistics";
  if (path === "/v2/logging") return "logging";
  if (SHARED_MEMORY_ROUTE.test(path)) return "shared-memory";
  if (TRACE_ROUTE.test(path)) return "trace";
  if (path.startsWith("/v2/repository/")) return "model-repository";
  const m = MODEL_ROUTE.exec(path);
  if (!m) return undefined;
  const action = m[3];
  return action === "ready"
    ? "health"
    : action === "config"
      ? "model-config"
      : action === "stats"
        ? "statistics"
        : action === "infer" || action === "generate" || action === "generate_stream"
          ? "inference"
          : "metadata";
}

/** A "file:<path>" load parameter's content over HTTP: base64 text. */
function base64Bytes(value: unknown): Uint8Array | undefined {
  return typeof value === "string" && /^[A-Za-z0-9+/]*={0,2}$/.test(value) ? Buffer.from(value, "base64") : undefined;
}

/** A request handler for the REST API; answers 404 for paths it does not know. */
export function restHandler(ctx: RestContext) {
  const { registry } = ctx;
  const maxInputBytes = ctx.maxInputBytes ?? DEFAULT_HTTP_MAX_INPUT_BYTES;
  const { logger } = ctx;
  const withheld: Withheld =
    logger.warn && ((detail, sent) => logger.warn?.({ detail, sent }, "error detail withheld from the client"));

  const requireMethod = (req: IncomingMessage, method: string) => {
    if (req.method !== method) throw new HttpError(405, "Method Not Allowed");
  };

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const rawPath = (req.url ?? "/").split("?")[0] ?? "/";
    let path: string;
    try {
      path = decodeURI(rawPath);
    } catch {
      throw new HttpError(400, `malformed percent-encoding in path ${rawPath}`);
    }
    const refused = restrictionError(ctx.restrictions, httpCategory(path), (h) => headerOf(req, h));
    if (refused) throw new HttpError(403, refused.rawMessage);
    if (path === "/v2" || path === "/v2/") {
      requireMethod(req, "GET");
      return sendJson(res, 200, { name: ctx.serverName, version: ctx.serverVersion, extensions: ctx.extensions });
    }
    if (path === "/v2/health/live") {
      requireMethod(req, "GET");
      return sendEmpty(res, 200);
    }
    if (path === "/v2/health/ready") {
      requireMethod(req, "GET");
      return sendEmpty(res, (await serverReady(registry)) ? 200 : 400);
    }
    if (path === "/v2/logging") {
      return sendJson(res, 200, logSetting(ctx.logSettings, await settingChanges(req, "log settings")));
    }
    const shm = SHARED_MEMORY_ROUTE.exec(path);
    if (shm) {
      const [, which, region = "", action] = shm;
      const kind = which === "system" ? "system" : "CUDA";
      if (action === "status") {
        requireMethod(req, "GET");
        return sendJson(
          res,
          200,
          sharedMemoryRegions(ctx.sharedMemory, kind, region).map((r) => ({
            name: r.name,
            key: r.key,
            offset: r.offset,
            byte_size: r.byteSize,
          })),
        );
      }
      requireMethod(req, "POST");
      if (action === "register") {
        if (!region) throw new HttpError(404, "Not Found");
        await registerSharedMemory(ctx.sharedMemory, kind, region, async () => {
          const body = parseObject(await readBody(req, maxInputBytes, ctx.decompressionBudget), "register request");
          return { key: body.key, offset: body.offset, byteSize: body.byte_size };
        });
        return sendEmpty(res, 200);
      }
      unregisterSharedMemory(ctx.sharedMemory, kind, region);
      return sendEmpty(res, 200);
    }
    const traceMatch = TRACE_ROUTE.exec(path);
    if (traceMatch) {
      const model = traceMatch[1];
      // A value may be a string, a list of strings, or null (clear back to the global setting).
      const changes: Record<string, string[]> = Object.fromEntries(
        Object.entries(await settingChanges(req, "trace settings")).map(([k, v]) => [k, traceSettingValue(k, v)]),
      );
      // The trace extension: a POST naming a model with no settings clears all of the model's own.
      return sendJson(res, 200, traceSetting(ctx.tracing, registry, model, changes, req.method === "POST"));
    }
    if (path === "/v2/models/stats") {
      requireMethod(req, "GET");
      return sendStats(res, registry.list());
    }
    if (path === "/v2/repository/index") {
      requireMethod(req, "POST");
      const body = parseObject(await readBody(req, maxInputBytes, ctx.decompressionBudget), "index request");
      if (body.ready !== undefined && typeof body.ready !== "boolean") {
        throw badRequest(`index request: 'ready' must be a boolean, got ${shownValue(body.ready)}`);
      }
      const rows = await repositoryIndex(registry, body.ready === true);
      return sendJson(
        res,
        200,
        rows.map((r) => ({
          name: r.name,
          ...(r.version ? { version: r.version } : {}),
          ...(r.state ? { state: r.state } : {}),
          ...(r.reason ? { reason: r.reason } : {}),
        })),
      );
    }
    const repoMatch = REPO_ROUTE.exec(path);
    if (repoMatch) {
      requireMethod(req, "POST");
      const [, name = "", action] = repoMatch;
      const raw = await readBody(req, maxInputBytes, ctx.decompressionBudget);
      if (action === "load") checkLoadFilesInJson(name, raw, registry.repository?.loadLimits);
      const body = parseObject(raw, `${action} request`);
      const parameters = parametersObject(body, `${action} request`);
      if (action === "load") await loadModel(registry, name, parameters, base64Bytes);
      else await unloadModel(registry, name, parameters);
      return sendEmpty(res, 200);
    }
    const m = MODEL_ROUTE.exec(path);
    if (m) {
      const [, name = "", version = "", action] = m;
      if (action === "infer") {
        requireMethod(req, "POST");
        return infer(req, res, name, version);
      }
      if (action === "generate" || action === "generate_stream") {
        requireMethod(req, "POST");
        return generate(req, res, name, version, action === "generate_stream");
      }
      requireMethod(req, "GET");
      if (action === "ready") {
        // As Triton's HandleModelReady: a model it cannot find answers with that error (404, or 503
        // for a version not ready), one found but not ready with 400.
        if (!(await modelReady(registry, name, version))) throw new HttpError(400, "Model version not ready");
        return sendEmpty(res, 200);
      }
      if (action === "stats") return sendStats(res, [statisticsStage(registry, name, version)]);
      const stage = registry.resolve(name, version);
      if (action === "config") return sendJson(res, 200, configToJson(stage.config));
      const md = await stage.metadata();
      return sendJson(res, 200, {
        name: md.name,
        versions: md.versions,
        platform: md.platform,
        inputs: md.inputs,
        outputs: md.outputs,
      });
    }
    throw new HttpError(404, "Not Found");
  }

  /** A settings endpoint's changes: none for GET, the JSON object a POST carries. */
  async function settingChanges(req: IncomingMessage, what: string): Promise<Record<string, unknown>> {
    if (req.method === "GET") return {};
    requireMethod(req, "POST");
    const body = parseJson(await readBody(req, maxInputBytes, ctx.decompressionBudget), what);
    if (!body || typeof body !== "object" || Array.isArray(body)) {
      throw new StageError(Code.InvalidArgument, "", `${what} must be a JSON object`);
    }
    return body as Record<string, unknown>;
  }

  async function sendStats(res: ServerResponse, stages: ReturnType<ModelRegistry["list"]>): Promise<void> {
    const stats = await Promise.all(stages.map((s) => s.statistics()));
    sendJson(res, 200, {
      model_stats: stats.map((s) =>
        numbersForInt64(toJson(ModelStatisticsSchema, s, { useProtoFieldName: true, alwaysEmitImplicit: true })),
      ),
    });
  }

  /**
   * The request's trace when it is sampled: its receipt stamped, handed to the stage through
   * `options`, its send end stamped and the trace ended as the answer goes.
   */
  function beginTrace(
    req: IncomingMessage,
    res: ServerResponse,
    stage: { name: string; version: string },
    requestId: string | undefined,
    recvStartNs: number,
    recvEndNs: number,
    options: InferOptions,
  ): RequestTrace | undefined {
    const trace = ctx.tracing?.begin(stage.name, stage.version, requestId, (h) => headerOf(req, h));
    if (!trace) return undefined;
    trace.stamp("HTTP_RECV_START", recvStartNs);
    trace.stamp("HTTP_RECV_END", recvEndNs);
    options.trace = trace;
    res.once("finish", () => trace.stamp("HTTP_SEND_END", nowNs()));
    res.once("close", () => trace.end());
    return trace;
  }

  /**
   * Triton's generate extension (see generate.ts). /generate answers once, as JSON; a decoupled
   * model must send exactly one response there. /generate_stream answers with Server-Sent Events,
   * one "data:" event per response; a failure before the first is an ordinary error answer, one
   * after it an {"error": ...} event, since the status has gone out with the first.
   */
  async function generate(
    req: IncomingMessage,
    res: ServerResponse,
    model: string,
    version: string,
    streaming: boolean,
  ): Promise<void> {
    const stage = registry.resolve(model, version);
    const recvStartNs = nowNs();
    const body = parseJson(await readBody(req, maxInputBytes, ctx.decompressionBudget), "generate request");
    const recvEndNs = nowNs();
    const request = generateRequest(body, await stage.metadata(), stage.config.maxBatchSize > 0);
    if (ctx.forwardHeaders) {
      request.parameters = withForwardedHeaders(
        request.parameters,
        forwardedHeaders(ctx.forwardHeaders, Object.entries(req.headers)),
      );
    }
    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort(new StageError(Code.Canceled, model, "client closed the connection"));
    });
    const options: InferOptions = { signal: abort.signal };
    const trace = beginTrace(req, res, stage, undefined, recvStartNs, recvEndNs, options);
    const responses = answersOf(stage, request, options);
    if (!streaming) {
      const answers: InferResponse[] = [];
      for await (const r of responses) answers.push(r);
      if (answers.length !== 1) {
        throw new StageError(
          Code.InvalidArgument,
          model,
          `generate answers with one response, and the model sent ${answers.length}: use generate_stream`,
        );
      }
      trace?.stamp("HTTP_SEND_START");
      return sendJson(res, 200, generateAnswer(answers[0] as InferResponse));
    }
    const event = (answer: unknown) => `data: ${stringifyJson(answer)}\n\n`;
    try {
      for await (const r of responses) {
        // The client went away: stop the model's responses (its iterator is returned).
        if (abort.signal.aborted) break;
        if (!res.headersSent) {
          trace?.stamp("HTTP_SEND_START");
          res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" });
        }
        res.write(event(generateAnswer(r)));
      }
    } catch (err) {
      if (!res.headersSent) throw err;
      res.write(event({ error: clientError(err, withheld).rawMessage }));
    }
    if (!res.headersSent) res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8" });
    res.end();
  }

  async function infer(req: IncomingMessage, res: ServerResponse, model: string, version: string): Promise<void> {
    // Triton answers an infer on an unknown or unavailable model with its error's code: 404 for one
    // not found (http_server.cc HandleInfer since server PR #6713), 503 for a version not ready.
    const resolve = () => {
      try {
        return registry.resolve(model, version);
      } catch (err) {
        sendError(res, err, undefined, withheld);
        return undefined;
      }
    };
    const recvStartNs = nowNs();
    // Checked before the upload, like Triton; looked up again after it (below).
    if (!resolve()) return;
    const body = await readBody(req, maxInputBytes, ctx.decompressionBudget);
    const recvEndNs = nowNs();
    const headerLength = binaryHeaderLength(req, ctx.binaryMime);
    let jsonPart: Uint8Array = body;
    let binary: Uint8Array = new Uint8Array(0);
    if (headerLength !== undefined) {
      const n = Number(headerLength);
      if (!Number.isInteger(n) || n < 0 || n > body.byteLength) {
        throw new StageError(
          Code.InvalidArgument,
          "",
          `Inference-Header-Content-Length ${headerLength} is not within the ${body.byteLength}-byte body`,
        );
      }
      jsonPart = body.subarray(0, n);
      binary = body.subarray(n);
    }
    const parsed = parseObject(jsonPart, "inference request") as unknown as JsonInferRequest;
    if (!Array.isArray(parsed.inputs)) throw new StageError(Code.InvalidArgument, "", "request has no 'inputs' array");
    if (parsed.outputs !== undefined && !Array.isArray(parsed.outputs)) {
      throw new StageError(Code.InvalidArgument, "", "'outputs' must be an array");
    }

    // For Triton's byte-size refusal, which names the model and the request's id.
    const requestId = typeof parsed.id === "string" ? parsed.id : undefined;
    let offset = 0;
    const inputs = parsed.inputs.map((t) => {
      if (typeof t !== "object" || t === null || Array.isArray(t)) {
        throw badRequest(`every input must be a JSON object, got ${shownValue(t)}`);
      }
      if (typeof t.name !== "string") throw badRequest("every input needs a string 'name'");
      const shm = sharedMemoryRef(parametersFromJson(t.parameters, `input '${t.name}'`), `input '${t.name}'`);
      if (shm) {
        if (!ctx.sharedMemory) throw sharedMemoryNotTaken();
        if (t.data !== undefined) {
          throw new StageError(Code.InvalidArgument, "", `input '${t.name}': data and shared memory are both given`);
        }
        return tensorFromBinary(t, ctx.sharedMemory.read(shm, `input '${t.name}'`), model, requestId);
      }
      const size = t.parameters?.binary_data_size;
      if (size === undefined) return tensorFromJson(t);
      if (!Number.isSafeInteger(size) || (size as number) < 0) {
        throw badRequest(`input '${t.name}': binary_data_size must be a byte count, got ${shownValue(size)}`);
      }
      const end = offset + (size as number);
      if (end > binary.byteLength) {
        throw new StageError(
          Code.InvalidArgument,
          "",
          `input '${t.name}': binary_data_size ${size} runs past the ${binary.byteLength}-byte binary section (at offset ${offset})`,
        );
      }
      const tensor = tensorFromBinary(t, binary.subarray(offset, end), model, requestId);
      offset = end;
      return tensor;
    });
    if (offset !== binary.byteLength) {
      throw new StageError(
        Code.InvalidArgument,
        "",
        `unexpected additional input data: ${binary.byteLength - offset} binary bytes not claimed by any input`,
      );
    }

    const params = parametersFromJson(parsed.parameters, "request") ?? {};
    // Triton's typed parameters: of the wrong type, the client's mistake (refused), never ignored.
    const options: InferOptions = inferOptionsFromParameters(params);
    const { binary_data_output: binaryDefault, priority: _p, timeout: _t, ...stageParams } = params;
    if (binaryDefault !== undefined && typeof binaryDefault !== "boolean") {
      throw badRequest(`request parameter 'binary_data_output' must be a boolean, got ${shownValue(binaryDefault)}`);
    }

    const binaryOutputs = new Map<string, boolean>();
    const shmOutputs = new Map<string, SharedMemoryRef>();
    const outputs: RequestedOutput[] | undefined = parsed.outputs?.map((o) => {
      if (typeof o?.name !== "string")
        throw new StageError(Code.InvalidArgument, "", "every output needs a string 'name'");
      const p = parametersFromJson(o.parameters, `output '${o.name}'`) ?? {};
      const shm = sharedMemoryRef(p, `output '${o.name}'`);
      if (shm) {
        if (!ctx.sharedMemory) throw sharedMemoryNotTaken();
        shmOutputs.set(o.name, shm);
      }
      const { binary_data: bin, ...rest } = withoutSharedMemory(p) ?? {};
      if (bin !== undefined && typeof bin !== "boolean") {
        throw badRequest(`output '${o.name}': parameter 'binary_data' must be a boolean, got ${shownValue(bin)}`);
      }
      if (bin !== undefined) binaryOutputs.set(o.name, bin);
      return Object.keys(rest).length > 0 ? { name: o.name, parameters: rest as Parameters } : { name: o.name };
    });

    const abort = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) abort.abort(new StageError(Code.Canceled, model, "client closed the connection"));
    });
    options.signal = abort.signal;
    const request: InferRequest = {
      id: typeof parsed.id === "string" && parsed.id ? parsed.id : undefined,
      inputs,
      outputs,
      parameters: withForwardedHeaders(
        Object.keys(stageParams).length > 0 ? stageParams : undefined,
        ctx.forwardHeaders && forwardedHeaders(ctx.forwardHeaders, Object.entries(req.headers)),
      ),
    };
    // The model may have been unloaded or reloaded while the body arrived: use what is loaded now.
    const stage = resolve();
    if (!stage) return;
    const trace = beginTrace(req, res, stage, request.id, recvStartNs, recvEndNs, options);
    const response = await stage.infer(request, options);
    trace?.stamp("HTTP_SEND_START");

    const chunks: Uint8Array[] = [];
    const outJson = response.outputs.map((t) => {
      const shm = shmOutputs.get(t.name);
      if (shm && ctx.sharedMemory) {
        const raw = tensorToRaw(t);
        ctx.sharedMemory.write(shm, raw, `output '${t.name}'`);
        const parameters = sharedMemoryOutputParameters(shm, raw.byteLength);
        return { name: t.name, datatype: t.datatype, shape: t.shape, parameters };
      }
      const asBinary = binaryOutputs.get(t.name) ?? binaryDefault === true;
      if (asBinary) {
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
        outputs: outJson,
      }),
    );
    const headers: Record<string, string | number> =
      chunks.length === 0
        ? { "content-type": "application/json" }
        : ctx.binaryMime
          ? { "content-type": `${ctx.binaryMime}${head.byteLength}` }
          : { "content-type": "application/octet-stream", [HEADER_LENGTH]: head.byteLength };
    const coding = responseEncoding(req.headers["accept-encoding"]);
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
    let total = head.byteLength;
    for (const c of chunks) total += c.byteLength;
    res.writeHead(200, { ...headers, "content-length": total });
    res.write(head);
    for (const c of chunks) res.write(c);
    res.end();
  }

  return (req: IncomingMessage, res: ServerResponse): void => {
    route(req, res).catch((err) => {
      ctx.logger.debug({ url: req.url, err: String(err) }, "request failed");
      sendError(res, err, undefined, withheld);
    });
  };
}
