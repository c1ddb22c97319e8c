/**
 * Triton's SageMaker endpoint (--allow-sagemaker): the routes a SageMaker
 * container serves on its port (8080).
 *
 * Single-model endpoints, for the model SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names:
 * - GET /ping: 200 while the server is ready (SAGEMAKER_TRITON_PING_MODE=live:
 *   while it is up), else 400, as Triton answers.
 * - POST /invocations: a KServe v2 inference request to that model, answered
 *   by the HTTP/REST frontend's own code: JSON tensors, or the binary tensor
 *   extension with the JSON header's length carried in the content type
 *   ("application/vnd.sagemaker-triton.binary+json;json-header-size=<n>"),
 *   as SageMaker passes bodies through without Triton's own header; or, as
 *   SAGEMAKER_TRITON_INFERENCE_TYPE says, a generate or generate_stream request.
 *
 * Multi-model endpoints (SageMaker loads and unloads models as they are called),
 * as Triton's frontend answers them, in explicit model control mode:
 * - POST /models {"model_name", "url"}: the folder at url (a model's folder, or a
 *   repository holding one model or an ensemble and its steps) registered as a
 *   repository and its model loaded under the name X-Amzn-SageMaker-Target-Model
 *   gives (else model_name); 409 for a model_name already loaded, 507 for a load
 *   that ran out of memory, else 400 saying why.
 * - GET /models: {"models": [{"modelName", "modelUrl"}]} for those ready;
 *   GET /models/{name}: one of them, or 404.
 * - POST /models/{name}/invoke: inference, as /invocations, on the model loaded for it.
 * - DELETE /models/{name}: unloaded with its ensemble steps, repository unregistered.
 * The model-repository restriction (--http-restricted-api) guards all but invoke.
 *
 * Anything else is 400.
 */
import { realpath, stat } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { basename, dirname, join, relative, resolve, sep } from "node:path";
import { Code } from "@trellis/stage";
import { toConnectError } from "@trellis/stage/backend";
import { type ApiRestrictions, restrictionError } from "../restrictions.js";
import { sendJson } from "./body.js";
import { forwardTo, type Handler, sendError } from "./cloud-endpoint.js";

/** What /invocations runs (SAGEMAKER_TRITON_INFERENCE_TYPE): KServe v2 infer, or the generate extension's routes. */
const INFERENCE_TYPES = ["infer", "generate", "generate_stream"] as const;
export type InferenceType = (typeof INFERENCE_TYPES)[number];

export const SAGEMAKER_BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size=";
const TARGET_MODEL_HEADER = "x-amzn-sagemaker-target-model";
/** A load request is a short JSON object. */
const LOAD_BODY_MAX_BYTES = 64 * 1024;

/** What the multi-model endpoint needs from the model repository manager. */
export interface SageMakerModelHost {
  /** Registers `repository`, its folder `folder` served as `name`, and loads `name` (and its steps). */
  load(name: string, repository: string, folder: string): Promise<void>;
  /** Unloads `name` and the steps it loaded, and unregisters `repository`. */
  unload(name: string, repository: string): Promise<void>;
  isReady(name: string): boolean;
  /** The models a repository folder holds (its folder names), and the names of those it could not read. */
  scan(repository: string): Promise<RepositoryListing>;
}

export interface RepositoryListing {
  models: { name: string; folder: string; ensemble: boolean }[];
  unreadable: string[];
}

export interface SageMakerOptions {
  /** SAGEMAKER_TRITON_DEFAULT_MODEL_NAME (undefined: /invocations says it is not set). */
  model?: string;
  /** SAGEMAKER_TRITON_PING_MODE: "ready" (default) or "live". */
  pingMode: "ready" | "live";
  /** SAGEMAKER_TRITON_INFERENCE_TYPE: what /invocations runs: "infer" (default), "generate" or "generate_stream". */
  inferenceType: InferenceType;
  ready(): Promise<boolean>;
  /** The multi-model endpoint's host (undefined: /models routes say there is none). */
  models?: SageMakerModelHost;
  /**
   * The folder a multi-model load's url must lie in (--sagemaker-model-root; SageMaker unpacks
   * models under /opt/ml/models): a client names a folder, the server loads the code in it.
   */
  modelRoot?: string;
  /** --http-restricted-api: its model-repository rule guards the /models routes but invoke. */
  restrictions?: ApiRestrictions;
}

/** The SageMaker settings from the environment, as Triton reads them. */
export function sageMakerOptionsFromEnv(
  env: NodeJS.ProcessEnv,
  ready: () => Promise<boolean>,
): Pick<SageMakerOptions, "model" | "pingMode" | "inferenceType" | "ready"> {
  const pingMode = env.SAGEMAKER_TRITON_PING_MODE ?? "ready";
  if (pingMode !== "ready" && pingMode !== "live") {
    throw new Error(`SAGEMAKER_TRITON_PING_MODE=${pingMode}: expected ready or live`);
  }
  const inferenceType = env.SAGEMAKER_TRITON_INFERENCE_TYPE ?? "infer";
  if (!(INFERENCE_TYPES as readonly string[]).includes(inferenceType)) {
    throw new Error(`Invalid SAGEMAKER_TRITON_INFERENCE_TYPE=${inferenceType}: expected ${INFERENCE_TYPES.join(", ")}`);
  }
  return {
    model: env.SAGEMAKER_TRITON_DEFAULT_MODEL_NAME || undefined,
    pingMode,
    inferenceType: inferenceType as InferenceType,
    ready,
  };
}

/** A model loaded through the multi-model endpoint: the name it is served under, and the repository registered for it. */
interface LoadedModel {
  target: string;
  repository: string;
}

/** Triton's signs of a load that ran out of memory, which SageMaker is told with 507. */
const OUT_OF_MEMORY = [
  /out of memory/i,
  /CUDA_OUT_OF_MEMORY/,
  /MemoryError/,
  /OutOfMemory/,
  /\bOOM\b/,
  /failed to allocate memory/i,
  /No space left on device/,
  /bad_alloc/,
  /ENOMEM/,
];

class LoadRefused extends Error {}

/**
 * Where the model to load lies, as Triton's SageMaker frontend finds it: `url` is the model's
 * own folder (it holds config.pbtxt), or a repository whose ensemble (or only model) it is.
 */
async function modelLocation(url: string, host: SageMakerModelHost): Promise<{ repository: string; folder: string }> {
  if (await stat(join(url, "config.pbtxt")).catch(() => undefined)) {
    return { repository: dirname(url), folder: basename(url) };
  }
  const { models, unreadable } = await host.scan(url).catch((err: Error) => {
    throw new LoadRefused(`url ${url}: ${err.message}`);
  });
  const ensembles = models.filter((m) => m.ensemble);
  if (ensembles.length > 1) {
    throw new LoadRefused(
      `url ${url}: holds ${ensembles.length} ensembles (${ensembles.map((m) => m.name).join(", ")}): one is served`,
    );
  }
  const pick = ensembles[0] ?? (models.length === 1 ? models[0] : undefined);
  if (!pick) {
    const found = [...models.map((m) => m.name), ...unreadable];
    throw new LoadRefused(
      found.length === 0
        ? `url ${url}: no model in it (a folder with config.pbtxt, or a repository of them)`
        : `url ${url}: holds ${found.join(", ")} and no ensemble: which one to serve is unclear`,
    );
  }
  return { repository: url, folder: pick.folder };
}

async function readLoadRequest(req: IncomingMessage): Promise<{ modelName: string; url: string }> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > LOAD_BODY_MAX_BYTES) throw new LoadRefused(`load request larger than ${LOAD_BODY_MAX_BYTES} bytes`);
    chunks.push(chunk);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch (err) {
    throw new LoadRefused(`load request: not JSON (${(err as Error).message})`);
  }
  const { model_name: modelName, url } = (body ?? {}) as Record<string, unknown>;
  if (typeof modelName !== "string" || !modelName || typeof url !== "string" || !url) {
    throw new LoadRefused('load request: expected {"model_name": "<name>", "url": "<path>"}');
  }
  return { modelName, url };
}

/** Where SageMaker unpacks a multi-model endpoint's models. */
export const DEFAULT_MODEL_ROOT = "/opt/ml/models";

/** Refuses a load url outside `root`, links followed (so a link inside cannot point out). */
async function checkInsideRoot(url: string, path: string, root: string): Promise<void> {
  const real = await realpath(path).catch(() => undefined);
  if (real === undefined) throw new LoadRefused(`url ${url}: no such folder`);
  const realRoot = await realpath(root).catch(() => resolve(root));
  const rel = relative(realRoot, real);
  if (rel === ".." || rel.startsWith(`..${sep}`) || resolve(realRoot, rel) !== real) {
    throw new LoadRefused(`url ${url}: not under the multi-model endpoint's model root (--sagemaker-model-root)`);
  }
}

/** The SageMaker routes, handing inference to `rest` (a REST handler made with SAGEMAKER_BINARY_MIME). */
export function sageMakerHandler(rest: Handler, options: SageMakerOptions): Handler {
  /** Models loaded through POST /models, by the model_name SageMaker gave. */
  const loaded = new Map<string, LoadedModel>();
  const targetOf = (req: IncomingMessage, fallback: string) => {
    const header = req.headers[TARGET_MODEL_HEADER];
    return (Array.isArray(header) ? header[0] : header) || fallback;
  };

  async function loadModel(req: IncomingMessage, res: ServerResponse, host: SageMakerModelHost): Promise<void> {
    const { modelName, url } = await readLoadRequest(req);
    const path = resolve(url);
    if (/^\/(dev|proc|sys)(\/|$)/.test(path)) {
      throw new LoadRefused(`url ${url}: cannot start with /dev/, /proc/ or /sys/`);
    }
    await checkInsideRoot(url, path, options.modelRoot ?? DEFAULT_MODEL_ROOT);
    if (loaded.has(modelName)) return sendError(res, 409, `model '${modelName}' is already loaded`);
    const target = targetOf(req, modelName);
    const { repository, folder } = await modelLocation(path, host);
    try {
      await host.load(target, repository, folder);
    } catch (err) {
      const error = toConnectError(err);
      const status =
        error.code === Code.AlreadyExists ? 409 : OUT_OF_MEMORY.some((re) => re.test(error.rawMessage)) ? 507 : 400;
      return sendError(res, status, error.rawMessage);
    }
    loaded.set(modelName, { target, repository });
    sendJson(res, 200, {});
  }

  async function unloadModel(res: ServerResponse, host: SageMakerModelHost, name: string): Promise<void> {
    const model = loaded.get(name);
    if (!model) return sendError(res, 404, `model '${name}' is not loaded`);
    try {
      await host.unload(model.target, model.repository);
    } catch (err) {
      return sendError(res, 400, toConnectError(err).rawMessage);
    }
    loaded.delete(name);
    sendJson(res, 200, {});
  }

  /** GET/POST /models, GET/DELETE /models/{name}, POST /models/{name}/invoke. */
  function models(req: IncomingMessage, res: ServerResponse, name: string | undefined, action: string | undefined) {
    const host = options.models;
    if (!host) return sendError(res, 400, "this server has no model repository to load SageMaker models into");
    if (action === "invoke" && req.method === "POST" && name !== undefined) {
      const model = loaded.get(name);
      if (!model) return sendError(res, 404, `model '${name}' is not loaded`);
      return forwardTo(rest, req, res, `/v2/models/${encodeURIComponent(targetOf(req, model.target))}/infer`);
    }
    if (action !== undefined) return sendError(res, 400, `${req.method} ${req.url}: not a SageMaker route`);
    const refused = restrictionError(options.restrictions, "model-repository", (h) => {
      const v = req.headers[h];
      return Array.isArray(v) ? v[0] : v;
    });
    if (refused) return sendError(res, 403, refused.rawMessage);
    const failed = (err: unknown) =>
      err instanceof LoadRefused ? sendError(res, 400, err.message) : sendError(res, 500, String(err));
    if (name === undefined && req.method === "GET") {
      const ready = [...loaded].filter(([, m]) => host.isReady(m.target));
      return sendJson(res, 200, { models: ready.map(([n, m]) => ({ modelName: n, modelUrl: m.repository })) });
    }
    if (name === undefined && req.method === "POST") return void loadModel(req, res, host).catch(failed);
    if (name !== undefined && req.method === "GET") {
      const model = loaded.get(name);
      if (!model) return sendError(res, 404, `model '${name}' is not loaded`);
      return sendJson(res, 200, { modelName: name, modelUrl: model.repository });
    }
    if (name !== undefined && req.method === "DELETE") return void unloadModel(res, host, name).catch(failed);
    sendError(res, 400, `${req.method} ${req.url}: not a SageMaker route`);
  }

  return (req, res) => {
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    if (path === "/ping" && req.method === "GET") {
      const answer = (up: boolean) => {
        res.writeHead(up ? 200 : 400, { "content-length": 0 });
        res.end();
      };
      if (options.pingMode === "live") answer(true);
      else options.ready().then(answer, () => answer(false));
      return;
    }
    const route = /^\/models(?:\/([^/]+)(?:\/([^/]+))?)?\/?$/.exec(path);
    if (route) {
      let name: string | undefined;
      try {
        name = route[1] === undefined ? undefined : decodeURIComponent(route[1]);
      } catch {
        return sendError(res, 400, `malformed percent-encoding in path ${path}`);
      }
      return models(req, res, name, route[2]);
    }
    if (path !== "/invocations" || req.method !== "POST") {
      sendError(
        res,
        400,
        `${req.method} ${path}: this SageMaker endpoint serves GET /ping, POST /invocations and /models`,
      );
      return;
    }
    if (!options.model) {
      sendError(res, 400, "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is not set: no model to invoke");
      return;
    }
    forwardTo(rest, req, res, `/v2/models/${encodeURIComponent(options.model)}/${options.inferenceType}`);
  };
}
