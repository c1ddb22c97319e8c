/**
 * loadStage: one repository model to a Stage, by backend. This is the
 * loader both the ensemble's steps and the server use, and the one place a
 * model computed in this process (a TypeScript stage, an ONNX model) gets its
 * model runtime (checks, batching, instances, statistics).
 */
import { join } from "node:path";
import { createEnsemble, type EnsembleStage, type HoldStep, type ResolveStep } from "@trellis/ensemble-runner";
import type { GrpcTlsOptions } from "@trellis/kserve";
import type { ModelConfig } from "@trellis/protocol";
import {
  createModel,
  definitionBackend,
  definitionInstances,
  type ModelBackend,
  type ModelInterceptor,
  stageBackend,
} from "@trellis/runtime";
import {
  Code,
  type CpuGate,
  configParameter,
  isDecoupled,
  type ModelCaller,
  type RateLimiter,
  type Stage,
  type StageDefinition,
  StageError,
  type StageFactoryOptions,
  type StageLogger,
} from "@trellis/stage";
import { isStageDefinition } from "@trellis/stage/backend";
import { pythonRefusal } from "./python-models.js";
import { connectRemote, type RemoteOptions, remoteOptions } from "./remote.js";
import { type RepositoryModel, type RepositorySource, scanRepository } from "./scan.js";
import { exists, factoryOf, importModule, typescriptFactory, workerInstances } from "./typescript-modules.js";

export interface LoadStageOptions {
  /** Version folder to load. */
  version: string;
  /** How an ensemble reaches its steps; default: load them from `repositories` (and `endpoints`). */
  resolveStep?: ResolveStep;
  /**
   * How each of an ensemble's requests takes its steps' models, once for its whole run (the
   * repository manager's: a step reloaded meanwhile never splits a request between versions).
   */
  holdStep?: HoldStep;
  /** The loaded model's cross-cutting features (tracing, cache, classification, shadow), in order. */
  interceptors?: readonly ModelInterceptor[];
  /** Every version of the model being served, for its metadata (Triton lists them all). */
  versions?: () => string[];
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
    const holdStep = options.resolveStep ? options.holdStep : undefined;
    const ensemble = await createEnsemble({
      config,
      version,
      resolveStep,
      logger,
      ownsSteps,
      ...(holdStep ? { holdStep } : {}),
    });
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
  return createModel({
    config: served.config,
    version: served.version,
    backend: served.backend,
    modelDir: model.modelDir,
    ...(options.defaultMaxQueueSize ? { defaultMaxQueueSize: options.defaultMaxQueueSize } : {}),
    ...(options.rateLimiter ? { rateLimiter: options.rateLimiter } : {}),
    ...(options.logger ? { logger: options.logger } : {}),
    ...(options.interceptors ? { interceptors: options.interceptors } : {}),
    ...(options.versions ? { versions: options.versions } : {}),
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
    computeBatch: (request, ctx) => ensemble.inferWithTimes(request, ctx.options),
    isReady: () => ensemble.isReady(),
    metadata: () => ensemble.metadata(),
    close: () => ensemble.close(),
  };
}

/** A remote model as a backend: its server checks, batches and computes; each request one call. */
export function remoteBackend(stage: Stage): ModelBackend {
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
        // A step is a model of its own: the ensemble's interceptors, versions and holds are not its.
        const { interceptors: _i, versions: _v, holdStep: _h, ...stepOptions } = options;
        return loadStage(model, { ...stepOptions, version: v, resolveStep: undefined, endpoints });
      })();
      loaded.set(key, stage);
    }
    return stage;
  };
}
