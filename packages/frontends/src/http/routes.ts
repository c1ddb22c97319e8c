/**
 * The HTTP/REST frontend's route table: each KServe v2 / Triton endpoint as a path pattern, the
 * methods it takes, its API group (for --http-restricted-api) and a small handler. Control
 * calls go through ../control.ts, as the gRPC frontend's do; inference through ./infer.ts.
 */
import { toJson } from "@bufbuild/protobuf";
import { checkLoadFilesInJson, type ModelRegistry, normalizedModelConfig, shownValue } from "@trellis/kserve";
import { type ModelConfig, ModelStatisticsSchema, modelConfigToJson } from "@trellis/protocol";
import { Code, StageError } from "@trellis/stage";
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
import type { ApiCategory } from "../restrictions.js";
import { badRequest, HttpError, parametersObject, parseJson, parseObject, sendEmpty, sendJson } from "./body.js";
import type { Exchange } from "./context.js";
import { generateRoute, inferRoute } from "./infer.js";

export interface Route {
  /** The path it answers, as sent (percent-encoded); its groups, decoded, are the handler's `match`. */
  path: RegExp;
  /** The methods it takes; any other is answered 405. */
  methods: readonly string[];
  /** Its group of endpoints, which --http-restricted-api may guard. */
  category: ApiCategory;
  handle(x: Exchange): Promise<void> | void;
}

const GET = ["GET"] as const;
const POST = ["POST"] as const;
/** Settings endpoints: GET reads them, POST changes them. */
const GET_OR_POST = ["GET", "POST"] as const;

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

/** A trace setting's value: a string, number or boolean, a list of them, or null (back to the default). */
function traceSettingValue(key: string, v: unknown): string[] {
  const scalar = (x: unknown) => typeof x === "string" || typeof x === "number" || typeof x === "boolean";
  if (v === null) return [];
  if (scalar(v)) return [String(v)];
  if (Array.isArray(v) && v.every(scalar)) return v.map(String);
  throw badRequest(`trace setting '${key}' must be a string, a number, a list of them or null, got ${shownValue(v)}`);
}

/** A "file:<path>" load parameter's content over HTTP: base64 text. */
function base64Bytes(value: unknown): Uint8Array | undefined {
  return typeof value === "string" && /^[A-Za-z0-9+/]*={0,2}$/.test(value) ? Buffer.from(value, "base64") : undefined;
}

/** A settings endpoint's changes: none for GET, the JSON object a POST carries. */
async function settingChanges({ rest, req }: Exchange, what: string): Promise<Record<string, unknown>> {
  if (req.method === "GET") return {};
  const body = parseJson(await rest.body(req), what);
  if (!body || typeof body !== "object" || Array.isArray(body)) {
    throw new StageError(Code.InvalidArgument, "", `${what} must be a JSON object`);
  }
  return body as Record<string, unknown>;
}

async function sendStats({ res }: Exchange, stages: ReturnType<ModelRegistry["list"]>): Promise<void> {
  const stats = await Promise.all(stages.map((s) => s.statistics()));
  sendJson(res, 200, {
    model_stats: stats.map((s) =>
      numbersForInt64(toJson(ModelStatisticsSchema, s, { useProtoFieldName: true, alwaysEmitImplicit: true })),
    ),
  });
}

function serverMetadata({ rest, res }: Exchange): void {
  const { serverName, serverVersion, extensions } = rest.ctx;
  sendJson(res, 200, { name: serverName, version: serverVersion, extensions });
}

async function health({ rest, res }: Exchange): Promise<void> {
  sendEmpty(res, (await serverReady(rest.registry)) ? 200 : 400);
}

async function logging(x: Exchange): Promise<void> {
  sendJson(x.res, 200, logSetting(x.rest.ctx.logSettings, await settingChanges(x, "log settings")));
}

/** The shared memory kind a /v2/{system,cuda}sharedmemory path names. */
const shmKind = (x: Exchange) => (x.match[1] === "system" ? "system" : "CUDA");

function sharedMemoryStatus(x: Exchange): void {
  const regions = sharedMemoryRegions(x.rest.ctx.sharedMemory, shmKind(x), x.match[2] ?? "");
  sendJson(
    x.res,
    200,
    regions.map((r) => ({ name: r.name, key: r.key, offset: r.offset, byte_size: r.byteSize })),
  );
}

async function sharedMemoryRegister(x: Exchange): Promise<void> {
  const region = x.match[2] ?? "";
  if (!region) throw new HttpError(404, "Not Found");
  await registerSharedMemory(x.rest.ctx.sharedMemory, shmKind(x), region, async () => {
    const body = parseObject(await x.rest.body(x.req), "register request");
    return { key: body.key, offset: body.offset, byteSize: body.byte_size };
  });
  sendEmpty(x.res, 200);
}

function sharedMemoryUnregister(x: Exchange): void {
  unregisterSharedMemory(x.rest.ctx.sharedMemory, shmKind(x), x.match[2] ?? "");
  sendEmpty(x.res, 200);
}

async function traceSettings(x: Exchange): Promise<void> {
  // A value may be a string, a list of strings, or null (clear back to the global setting).
  const changes: Record<string, string[]> = Object.fromEntries(
    Object.entries(await settingChanges(x, "trace settings")).map(([k, v]) => [k, traceSettingValue(k, v)]),
  );
  // The trace extension: a POST naming a model with no settings clears all of the model's own.
  const { rest, req, match } = x;
  sendJson(x.res, 200, traceSetting(rest.ctx.tracing, rest.registry, match[1], changes, req.method === "POST"));
}

async function repositoryIndexRoute({ rest, req, res }: Exchange): Promise<void> {
  const body = parseObject(await rest.body(req), "index request");
  if (body.ready !== undefined && typeof body.ready !== "boolean") {
    throw badRequest("Invalid value for 'ready': expected a boolean");
  }
  const rows = await repositoryIndex(rest.registry, body.ready === true);
  sendJson(
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

async function repositoryLoad({ rest, req, res, match }: Exchange): Promise<void> {
  const [, name = "", action] = match;
  const raw = await rest.body(req);
  if (action === "load") checkLoadFilesInJson(name, raw, rest.registry.repository?.loadLimits);
  const body = parseObject(raw, `${action} request`);
  const parameters = parametersObject(body, `${action} request`);
  if (action === "load") await loadModel(rest.registry, name, parameters, base64Bytes);
  else await unloadModel(rest.registry, name, parameters);
  sendEmpty(res, 200);
}

async function modelMetadata({ rest, res, match }: Exchange): Promise<void> {
  const md = await rest.registry.resolve(match[1] ?? "", match[2] ?? "").metadata();
  const { name, versions, platform, inputs, outputs } = md;
  sendJson(res, 200, { name, versions, platform, inputs, outputs });
}

/**
 * As Triton's HandleModelReady: a model it cannot find answers with that error (404, or 503
 * for a version not ready), one found but not ready with 400.
 */
async function modelReadyRoute({ rest, res, match }: Exchange): Promise<void> {
  if (!(await modelReady(rest.registry, match[1] ?? "", match[2] ?? ""))) {
    throw new HttpError(400, "Model version not ready");
  }
  sendEmpty(res, 200);
}

function modelConfig({ rest, res, match }: Exchange): void {
  sendJson(res, 200, configToJson(rest.registry.resolve(match[1] ?? "", match[2] ?? "").config));
}

function modelStats(x: Exchange): Promise<void> {
  return sendStats(x, [statisticsStage(x.rest.registry, x.match[1] ?? "", x.match[2] ?? "")]);
}

const SHARED_MEMORY = "^/v2/(system|cuda)sharedmemory(?:/region/([^/]+))?";
/** A model's path: its name, and its version when given. */
const MODEL = "^/v2/models/([^/]+)(?:/versions/([^/]+))?";

/** The routes, first match first: /v2/models/stats is the statistics of all models, not a model's metadata. */
export const ROUTES: readonly Route[] = [
  { path: /^\/v2\/?$/, methods: GET, category: "metadata", handle: serverMetadata },
  { path: /^\/v2\/health\/live$/, methods: GET, category: "health", handle: ({ res }) => sendEmpty(res, 200) },
  { path: /^\/v2\/health\/ready$/, methods: GET, category: "health", handle: health },
  { path: /^\/v2\/logging$/, methods: GET_OR_POST, category: "logging", handle: logging },
  { path: RegExp(`${SHARED_MEMORY}/status$`), methods: GET, category: "shared-memory", handle: sharedMemoryStatus },
  {
    path: RegExp(`${SHARED_MEMORY}/register$`),
    methods: POST,
    category: "shared-memory",
    handle: sharedMemoryRegister,
  },
  {
    path: RegExp(`${SHARED_MEMORY}/unregister$`),
    methods: POST,
    category: "shared-memory",
    handle: sharedMemoryUnregister,
  },
  {
    path: /^\/v2\/(?:models\/([^/]+)\/)?trace\/setting$/,
    methods: GET_OR_POST,
    category: "trace",
    handle: traceSettings,
  },
  {
    path: /^\/v2\/models\/stats$/,
    methods: GET,
    category: "statistics",
    handle: (x) => sendStats(x, x.rest.registry.list()),
  },
  { path: /^\/v2\/repository\/index$/, methods: POST, category: "model-repository", handle: repositoryIndexRoute },
  {
    path: /^\/v2\/repository\/models\/([^/]+)\/(load|unload)$/,
    methods: POST,
    category: "model-repository",
    handle: repositoryLoad,
  },
  { path: RegExp(`${MODEL}$`), methods: GET, category: "metadata", handle: modelMetadata },
  { path: RegExp(`${MODEL}/ready$`), methods: GET, category: "health", handle: modelReadyRoute },
  { path: RegExp(`${MODEL}/config$`), methods: GET, category: "model-config", handle: modelConfig },
  { path: RegExp(`${MODEL}/stats$`), methods: GET, category: "statistics", handle: modelStats },
  { path: RegExp(`${MODEL}/infer$`), methods: POST, category: "inference", handle: inferRoute },
  { path: RegExp(`${MODEL}/generate$`), methods: POST, category: "inference", handle: (x) => generateRoute(x, false) },
  {
    path: RegExp(`${MODEL}/generate_stream$`),
    methods: POST,
    category: "inference",
    handle: (x) => generateRoute(x, true),
  },
];

/** Paths under these prefixes that are no route are still their group's, refused as such when it is restricted. */
const PREFIX_CATEGORIES: readonly [string, ApiCategory][] = [
  ["/v2/health/", "health"],
  ["/v2/repository/", "model-repository"],
];

/** The route for a path as sent and its groups, or only the group its prefix falls in. */
export function findRoute(
  path: string,
): { route: Route; match: RegExpExecArray } | { route: undefined; category: ApiCategory | undefined } {
  for (const route of ROUTES) {
    const match = route.path.exec(path);
    if (match) return { route, match };
  }
  return { route: undefined, category: PREFIX_CATEGORIES.find(([prefix]) => path.startsWith(prefix))?.[1] };
}
