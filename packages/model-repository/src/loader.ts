/**
 * loadStage: one repository model to a Stage, by backend. This is the
 * loader both the ensemble's steps and the server use, and the one place a
 * model computed in this process (a TypeScript stage, an ONNX model) gets its
 * model runtime (checks, batching, instances, statistics).
 */
import { stat } from "node:fs/promises";
import { basename, isAbsolute, join, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { createEnsemble, type EnsembleStage, type ResolveStep } from "@trellis/ensemble-runner";
import { type ConnectStageOptions, connectStage, type GrpcTlsOptions, grpcTransport } from "@trellis/kserve";
import type { ModelConfig } from "@trellis/protocol";
import {
  createModelRuntime,
  definitionBackend,
  definitionInstances,
  instanceCount,
  type ModelBackend,
  stageBackend,
  startWorkerInstances,
} from "@trellis/runtime";
import {
  Code,
  type CpuGate,
  configParameter,
  datatypeFromConfig,
  isDecoupled,
  type ModelCaller,
  type RateLimiter,
  type Stage,
  type StageDefinition,
  StageError,
  type StageFactory,
  type StageFactoryOptions,
  type StageLogger,
} from "@trellis/stage";
import { delegateStage, isStageDefinition } from "@trellis/stage/backend";
import { type RepositoryModel, type RepositorySource, scanRepository } from "./scan.js";

export interface LoadStageOptions {
  /** Version folder to load. */
  version: string;
  /** How an ensemble reaches its steps; default: load them from `repositories` (and `endpoints`). */
  resolveStep?: ResolveStep;
  /** Repositories for the default resolveStep. */
  repositories?: (string | RepositorySource)[];
  /** Model name -> KServe v2 gRPC base URL: that model is a remote stage. */
  endpoints?: Record<string, string>;
  /** TLS for https:// endpoints: the CA to trust instead of the system's, a client certificate for mutual TLS. */
  remoteTls?: GrpcTlsOptions;
  /** Deadlines and keepalive of calls to endpoints (see connectRemote). */
  remote?: RemoteOptions;
  /** Default true; false lets the ONNX stage complete the config from the model. */
  strictModelConfig?: boolean;
  /** max_batch_size that auto-complete gives a batchable ONNX model whose config has none (Triton's default-max-batch-size, 4). */
  defaultMaxBatchSize?: number;
  /** The server's rate limiter (--rate-limit execution_count), handed to each stage factory. */
  rateLimiter?: RateLimiter;
  /** The server's models, handed to each stage factory: a TypeScript stage may call them (Triton's BLS). */
  models?: ModelCaller;
  /** The server's CPU gate, handed to each stage factory (ONNX runs with exclusive_cpu hold it alone, decodes shared). */
  cpuGate?: CpuGate;
  /** The queue bound of a model whose config sets no max_queue_size (--default-max-queue-size); 0: none. */
  defaultMaxQueueSize?: number;
  /** Python models (backend "python"): which python3 runs them (--python-executable), each execution's deadline. */
  python?: {
    pythonExecutable?: string;
    executeTimeoutMs?: number;
    maxFrameBytes?: number;
    maxStreamResponses?: number;
  };
  logger?: StageLogger;
}

/** Ensemble config parameters `endpoint.<model>` name remote steps inside the config itself. */
const ENDPOINT_PARAMETER = "endpoint.";

const exists = async (path: string) => (await stat(path).catch(() => undefined))?.isFile() ?? false;

/** How remote models (--endpoints) are called. */
export interface RemoteOptions {
  /** Deadline of each call to the remote, in ms (a decoupled model's: of each response); 0: none. Default 30 s. */
  timeoutMs?: number;
  /** HTTP/2 keepalive ping after this many ms without a frame while calls are in flight; 0: none. Default 10 s. */
  keepaliveTimeMs?: number;
  /** A ping unanswered this long (ms) closes the connection, failing its calls UNAVAILABLE. Default 5 s. */
  keepaliveTimeoutMs?: number;
  /** Where a remote going away (and coming back) is logged, with its URL. */
  logger?: StageLogger;
}

export const REMOTE_DEFAULTS = { timeoutMs: 30_000, keepaliveTimeMs: 10_000, keepaliveTimeoutMs: 5_000 } as const;

/**
 * A remote model over KServe v2 gRPC; version "" lets the server choose.
 * Each call has a deadline and the connection a keepalive (see RemoteOptions);
 * readiness answers from the last known state, checked in the background, so
 * a health check never waits on the remote. Errors name the model, never its
 * URL (that goes to the log): a deadline is DEADLINE_EXCEEDED, a remote that
 * cannot be reached, dropped the connection, or does not have the model
 * loaded (restarting) is UNAVAILABLE, so callers can tell "that service is
 * down, retry" from a real error.
 */
export async function connectRemote(
  name: string,
  url: string,
  version = "",
  tls?: GrpcTlsOptions,
  remote: RemoteOptions = {},
): Promise<Stage> {
  const timeoutMs = remote.timeoutMs ?? REMOTE_DEFAULTS.timeoutMs;
  const keepaliveTimeMs = remote.keepaliveTimeMs ?? REMOTE_DEFAULTS.keepaliveTimeMs;
  const options: ConnectStageOptions = {
    redactTransportErrors: true,
    endpoint: url,
    cachedReadiness: {},
    ...(timeoutMs > 0 ? { timeoutMs } : {}),
    ...(remote.logger ? { logger: remote.logger } : {}),
  };
  if (version) options.version = version;
  const transport = grpcTransport(url, {
    ...(tls ? { tls } : {}),
    ...(keepaliveTimeMs > 0
      ? {
          keepalive: {
            timeMs: keepaliveTimeMs,
            timeoutMs: remote.keepaliveTimeoutMs ?? REMOTE_DEFAULTS.keepaliveTimeoutMs,
          },
        }
      : {}),
  });
  let stage: Stage;
  try {
    stage = await connectStage(transport, name, options);
  } catch (err) {
    transport.close();
    throw err;
  }
  // The stage owns its connection: closing it (unload, ensemble close) ends the HTTP/2 session.
  // Everything else is the remote stage's own (a decoupled model's inferStream included).
  return delegateStage(stage, {
    close: async () => {
      await stage.close();
      transport.close();
    },
  });
}

/** The remote options of a load, with its logger unless they name one. */
const remoteOptions = (options: LoadStageOptions): RemoteOptions => ({
  ...(options.logger ? { logger: options.logger } : {}),
  ...options.remote,
});

/** The factory a module exports: `createStage`, else a default-exported function. */
function factoryOf(mod: Record<string, unknown>, where: string, model: string): StageFactory {
  const f = mod.createStage ?? mod.default;
  if (typeof f !== "function") {
    throw new StageError(Code.InvalidArgument, model, `${where} exports neither createStage nor a default function`);
  }
  return f as StageFactory;
}

async function importModule(specifier: string, model: string): Promise<Record<string, unknown>> {
  try {
    return (await import(specifier)) as Record<string, unknown>;
  } catch (err) {
    const message = err instanceof Error ? err.message : String(err);
    // Node names the importing file; when that is this loader, it says nothing about the model.
    const own = ` imported from ${fileURLToPath(import.meta.url)}`;
    const why = message.endsWith(own) ? message.slice(0, -own.length) : message;
    throw new StageError(Code.NotFound, model, `cannot import ${specifier}: ${why}`, { cause: err });
  }
}

/** `backend: "typescript"`: the module named by parameter `module`, else `<versionDir>/model.js` / `model.mjs`. */
async function typescriptFactory(model: RepositoryModel, versionDir: string): Promise<StageFactory> {
  const { specifier, where } = await typescriptModule(model, versionDir);
  return factoryOf(await importModule(specifier, model.name), where, model.name);
}

/** The stage module of a `backend: "typescript"` model: its specifier, and how errors call it. */
async function typescriptModule(
  model: RepositoryModel,
  versionDir: string,
): Promise<{ specifier: string; where: string; param?: string }> {
  const param = configParameter(model.config, "module");
  if (param) {
    // A path is the user's file (relative to the version folder); anything else is a package name.
    const isPath = param.startsWith(".") || isAbsolute(param);
    const specifier = isPath ? pathToFileURL(resolve(versionDir, param)).href : param;
    return { specifier, where: `module "${param}"`, param };
  }
  for (const file of ["model.js", "model.mjs"]) {
    const path = join(versionDir, file);
    if (await exists(path)) return { specifier: pathToFileURL(path).href, where: path };
  }
  throw new StageError(
    Code.InvalidArgument,
    model.name,
    `backend "typescript" needs a parameter "module" naming a stage package (e.g. "@trellis/preprocess") or a ${join(versionDir, "model.js")} exporting createStage`,
  );
}

/**
 * Parameter worker_threads "true": the stage's instances (instanceCount: the sum of instance_group counts, default 1)
 * each in a worker thread that loads the module; a package name is resolved here, where it is a dependency.
 */
async function workerInstances(
  model: RepositoryModel,
  versionDir: string,
  factoryOptions: StageFactoryOptions,
): Promise<Stage> {
  const { specifier, where, param } = await typescriptModule(model, versionDir);
  let resolved = specifier;
  if (!specifier.startsWith("file:")) {
    try {
      resolved = import.meta.resolve(specifier);
    } catch (err) {
      const why = err instanceof Error ? err.message : String(err);
      const own = ` imported from ${fileURLToPath(import.meta.url)}`;
      const message = `cannot import ${specifier}: ${why.endsWith(own) ? why.slice(0, -own.length) : why}`;
      throw new StageError(Code.NotFound, model.name, message, { cause: err });
    }
  }
  const { config, modelDir, version } = factoryOptions;
  return startWorkerInstances({
    specifier: resolved,
    label: param ? where : basename(where),
    factoryOptions: { config, modelDir, version, versionDir },
    instances: instanceCount(config),
    ...(factoryOptions.logger ? { logger: factoryOptions.logger } : {}),
    ...(factoryOptions.cpuGate ? { cpuGate: factoryOptions.cpuGate } : {}),
  });
}

/**
 * Loads `model` (version `options.version`) as a Stage: an ensemble, an ONNX
 * model, a TypeScript stage, or, when `options.endpoints` names it, the
 * remote model at that URL.
 */
export async function loadStage(model: RepositoryModel, options: LoadStageOptions): Promise<Stage> {
  const { config } = model;
  const { version, logger } = options;
  const remote = options.endpoints?.[model.name];
  if (remote) {
    const stage = await connectRemote(model.name, remote, "", options.remoteTls, remoteOptions(options));
    return serveModel({ config: stage.config, version: stage.version, backend: remoteBackend(stage) }, model, options);
  }

  if (!model.versions.includes(version)) {
    throw new StageError(
      Code.NotFound,
      model.name,
      `no version folder "${version}" in ${model.modelDir} (versions: [${model.versions.join(", ")}])`,
    );
  }
  const versionDir = join(model.modelDir, version);

  if (isDecoupled(config)) {
    // Served as if coupled, a model meant to answer many times (or none) would be misread: refused.
    const refuse = (why: string) =>
      new StageError(Code.InvalidArgument, model.name, `model_transaction_policy { decoupled: true }: ${why}`);
    if (config.backend === "onnxruntime" || config.platform === "onnxruntime_onnx") {
      throw refuse("an ONNX Runtime model answers each request once");
    }
    if (config.responseCache?.enable) throw refuse("the response cache does not support decoupled models");
  }

  if (config.platform === "ensemble") {
    const ownsSteps = !options.resolveStep;
    const resolveStep = options.resolveStep ?? repositoryResolver(model, options);
    const ensemble = await createEnsemble({ config, version, resolveStep, logger, ownsSteps });
    const served = await serveModel(
      { config: ensemble.config, version, backend: ensembleBackend(ensemble) },
      model,
      options,
    );
    // Its steps' shares of the traffic (StepStatistics) stay readable on the served model.
    return Object.assign(served, { stepStatistics: () => ensemble.stepStatistics() });
  }

  const onnx = config.backend === "onnxruntime" || config.platform === "onnxruntime_onnx";
  const sequence = config.schedulingChoice.case === "sequenceBatching";
  if (sequence && isDecoupled(config)) {
    throw new StageError(
      Code.InvalidArgument,
      model.name,
      "sequence_batching with model_transaction_policy { decoupled: true } is not supported: a sequence's requests here are answered once each",
    );
  }
  if (sequence && config.responseCache?.enable) {
    // As Triton's: only the default and dynamic batch schedulers cache; a stateful answer depends on the sequence so far.
    throw new StageError(
      Code.InvalidArgument,
      model.name,
      "response_cache is not supported with sequence_batching: a stateful model's answer depends on the sequence so far, not on the request alone",
    );
  }

  const factoryOptions: StageFactoryOptions = { config, modelDir: model.modelDir, version, versionDir };
  if (logger) factoryOptions.logger = logger;
  if (options.rateLimiter) factoryOptions.rateLimiter = options.rateLimiter;
  if (options.models) factoryOptions.models = options.models;
  if (options.cpuGate) factoryOptions.cpuGate = options.cpuGate;
  const backend = config.backend;
  if (onnx) {
    // @trellis/inference-onnx's createStage, as any stage package's, given the server's config rules.
    const factory = factoryOf(await importModule(ONNX_PACKAGE, model.name), ONNX_PACKAGE, model.name);
    const onnxOptions = {
      ...factoryOptions,
      strictModelConfig: options.strictModelConfig ?? true,
      ...(options.defaultMaxBatchSize !== undefined ? { defaultMaxBatchSize: options.defaultMaxBatchSize } : {}),
    };
    return serveTypescript(await factory(onnxOptions), model, options);
  }
  if (backend === "typescript") {
    const made =
      configParameter(config, "worker_threads")?.toLowerCase() === "true"
        ? await workerInstances(model, versionDir, factoryOptions)
        : await (await typescriptFactory(model, versionDir))(factoryOptions);
    if (isDecoupled(config) && !(isStageDefinition(made) ? made.computeStream : made.inferStream)) {
      await made.close?.();
      throw new StageError(
        Code.InvalidArgument,
        model.name,
        "model_transaction_policy { decoupled: true }, but the stage has no inferStream to send its responses (defineStage: give computeStream)",
      );
    }
    return serveTypescript(made, model, options);
  }
  if (backend === "python") {
    // Triton's Python backend, as a migration bridge: model.py runs only from this repository folder.
    const { autoCompletePythonConfig, createPythonBackend, pythonModelFile } = await import("@trellis/backend-python");
    const modelFile = pythonModelFile(config, model.modelDir, version);
    if (!(await exists(modelFile))) throw pythonRefusal(config, model.name, version);
    const strict = options.strictModelConfig ?? true;
    // configText "": the folder has no config.pbtxt (scan), so its config is all auto-complete's.
    if (strict && model.configText === "")
      throw new StageError(
        Code.InvalidArgument,
        model.name,
        "no config.pbtxt, and auto-complete is off (--strict-model-config / --disable-auto-complete-config)",
      );
    const pythonExecutable = options.python?.pythonExecutable;
    // As Triton: a Python model's auto_complete_config completes its config before instances start.
    const completed = strict
      ? config
      : await autoCompletePythonConfig({ config, modelFile, ...(pythonExecutable ? { pythonExecutable } : {}) });
    const python = await createPythonBackend({
      config: completed,
      modelDir: model.modelDir,
      version,
      ...(options.python ?? {}),
      ...(options.models ? { models: options.models } : {}),
      ...(logger ? { logger } : {}),
    });
    return serveModel({ config: completed, version, backend: python }, model, options);
  }
  const what = backend ? `backend "${backend}"` : config.platform ? `platform "${config.platform}"` : "no backend";
  throw new StageError(
    Code.InvalidArgument,
    model.name,
    `unsupported ${what}; supported: platform "ensemble", backend "onnxruntime" / platform "onnxruntime_onnx", backend "typescript", or a remote model listed in the endpoint map`,
  );
}

/**
 * A TypeScript stage (a package's or a user's StageDefinition, a Stage a module made itself, a
 * pool of worker instances) served by the model runtime. With neither instance_group nor
 * dynamic_batching the stage takes requests as they come, bounding its own work; dynamic_batching
 * without instance_group runs one instance (Triton's default), so batches form.
 */
function serveTypescript(
  made: Stage | StageDefinition,
  model: RepositoryModel,
  options: LoadStageOptions,
): Promise<Stage> {
  const { config } = model;
  const backend = isStageDefinition(made)
    ? definitionBackend(made, definitionInstances(made))
    : stageBackend(made, definitionInstances({ config }));
  return serveModel({ config: made.config, version: made.version ?? options.version, backend }, model, options);
}

/**
 * The model runtime of a model: admission (the queue bound), request checks, statistics,
 * dynamic and sequence batching, instance_group's count and the rate limiter, as for any
 * backend. Every model the server serves, whatever computes it, gets its runtime here.
 */
function serveModel(
  served: { config: ModelConfig; version: string; backend: ModelBackend },
  model: RepositoryModel,
  options: LoadStageOptions,
): Promise<Stage> {
  return createModelRuntime({
    config: served.config,
    version: served.version,
    backend: served.backend,
    modelDir: model.modelDir,
    ...(options.defaultMaxQueueSize ? { defaultMaxQueueSize: options.defaultMaxQueueSize } : {}),
    ...(options.rateLimiter ? { rateLimiter: options.rateLimiter } : {}),
    ...(options.logger ? { logger: options.logger } : {}),
  });
}

/**
 * An ensemble as a backend: one execution per request (no batching), the ensemble checking
 * the request against its own tensors and reporting the time its steps spent queued and
 * computing; admitted by its tightest step's bound, so no step refuses what an earlier one computed.
 */
function ensembleBackend(ensemble: EnsembleStage): ModelBackend {
  return {
    instances: Number.POSITIVE_INFINITY,
    checksRequests: true,
    tracesSteps: true,
    ...(ensemble.inferStream ? { decoupled: true, executeStream: ensemble.executeStream.bind(ensemble) } : {}),
    queueBound: () => ensemble.queueBound(),
    execute: (request, ctx) => ensemble.execute(request, ctx.options),
    isReady: () => ensemble.isReady(),
    metadata: () => ensemble.metadata(),
    close: () => ensemble.close(),
  };
}

/** A remote model as a backend: its server checks, batches and computes; each request one call. */
function remoteBackend(stage: Stage): ModelBackend {
  return { ...stageBackend(stage, Number.POSITIVE_INFINITY), checksRequests: true };
}

// Imported by name at load time so onnxruntime is only loaded when an ONNX model is.
const ONNX_PACKAGE = "@trellis/inference-onnx";

/**
 * The default way an ensemble reaches its steps: a remote endpoint when the
 * endpoint map (or the ensemble's `endpoint.<model>` parameters) names the
 * model, else the model from the same repositories. Each (model, version)
 * loads once, however many steps use it.
 */
function repositoryResolver(ensemble: RepositoryModel, options: LoadStageOptions): ResolveStep {
  const endpoints: Record<string, string> = {};
  for (const [key, p] of Object.entries(ensemble.config.parameters)) {
    if (key.startsWith(ENDPOINT_PARAMETER) && p.stringValue)
      endpoints[key.slice(ENDPOINT_PARAMETER.length)] = p.stringValue;
  }
  Object.assign(endpoints, options.endpoints);
  const repositories = options.repositories ?? [ensemble.repository];
  let scan: ReturnType<typeof scanRepository> | undefined;
  const loaded = new Map<string, Promise<Stage>>();
  return (name, version) => {
    const key = `${name}@${version}`;
    let stage = loaded.get(key);
    if (!stage) {
      stage = (async () => {
        const url = endpoints[name];
        if (url) {
          const v = version >= 0n ? String(version) : "";
          return connectRemote(name, url, v, options.remoteTls, remoteOptions(options));
        }
        scan ??= scanRepository(repositories);
        const { models, errors } = await scan;
        const model = models.find((m) => m.name === name);
        if (!model) {
          const broken = errors.find((e) => e.name === name);
          if (broken) throw new StageError(Code.InvalidArgument, name, broken.error.message, { cause: broken.error });
          throw new StageError(
            Code.NotFound,
            name,
            `unknown model "${name}" (not in ${repositories.map((r) => (typeof r === "string" ? r : r.path)).join(", ")} nor the endpoint map)`,
          );
        }
        const v = version >= 0n ? String(version) : model.versions.at(-1);
        if (!v) throw new StageError(Code.NotFound, name, `no version folders in ${model.modelDir}`);
        return loadStage(model, { ...options, version: v, resolveStep: undefined, endpoints });
      })();
      loaded.set(key, stage);
    }
    return stage;
  };
}

/** A Python model without its model file: where its TypeScript counterpart goes. */
function pythonRefusal(config: ModelConfig, name: string, version: string): StageError {
  const replacement = trellisReplacement(config);
  const file = config.defaultModelFilename || "model.py";
  return new StageError(
    Code.InvalidArgument,
    name,
    replacement
      ? `backend "python" needs ${file} in the version folder ${version}; ${replacement} does what this model's model.py does: in config.pbtxt, replace backend: "python" with the lines: backend: "typescript" parameters { key: "module" value: { string_value: "${replacement}" } }`
      : `backend "python" needs ${file} in the version folder ${version}; or set backend: "typescript" and either parameters { key: "module" value: { string_value: "<stage package>" } } or put a model.js exporting createStage(options) in the version folder ${version} (the TypeScript counterpart of model.py)`,
  );
}

/**
 * The Trellis package that replaces a Triton Python model, for the kinds it has: the seed's
 * ResNet-50 preprocess (an encoded image in, a [3, 224, 224] FP32 tensor out) and postprocess
 * (1000 logits in, a JSON string out), recognised by name or by that shape.
 */
function trellisReplacement(config: ModelConfig): string | undefined {
  type Tensors = { dataType: ModelConfig["input"][number]["dataType"]; dims: bigint[] }[];
  const types = (list: Tensors) =>
    list
      .map((t) => {
        try {
          return datatypeFromConfig(t.dataType);
        } catch {
          return "?";
        }
      })
      .join(",");
  const dims = (list: Tensors) => list.map((t) => t.dims.join("x")).join(",");
  const [inputs, outputs] = [types(config.input), types(config.output)];
  if (
    config.name === "resnet50_preprocess" ||
    (inputs === "BYTES" && outputs === "FP32" && dims(config.output) === "3x224x224")
  )
    return "@trellis/preprocess";
  if (
    config.name === "resnet50_postprocess" ||
    (inputs === "FP32" && outputs === "BYTES" && dims(config.input) === "1000")
  )
    return "@trellis/postprocess";
  return undefined;
}
