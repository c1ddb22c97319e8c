#!/usr/bin/env node
/**
 * trellis server: serves a Triton-layout model repository over KServe v2
 * gRPC and HTTP/REST, with Prometheus metrics, like `tritonserver`.
 */
import { basename, resolve } from "node:path";
import v8 from "node:v8";
// The optional integrations (the Redis cache, OpenTelemetry, SageMaker, Vertex AI) are imported
// where their flags switch them on: a server that does not use one never loads it (nor its packages).
import type { GrpcConnectionOptions } from "@trellis/frontends";
import type { SageMakerModelHost, SageMakerOptions, VertexAiOptions } from "@trellis/frontends/cloud";
import { SystemSharedMemory } from "@trellis/kserve/wire";
import {
  lendOwnPackages,
  modelLoader,
  RepositoryManager,
  readEndpointsFile,
  scanRepository,
} from "@trellis/model-repository";
import { importInInstanceThreads, ResponseCache, type ResponseStore } from "@trellis/runtime";
import { prepareSeedModels } from "./cli/bootstrap.js";
import { type Flags, program, readCommandLine, UsageError } from "./cli/cli.js";
import { createServerLogger, defaultLogStyle } from "./cli/logging.js";
import { startupFailure } from "./cli/usage.js";
import type { RedisResponseCache } from "./integrations/redis-cache.js";
import { RecentTraces } from "./observability/recent-traces.js";
import { Tracer } from "./observability/tracing.js";
import { type RunningServer, type ServerOptions, startServer } from "./server.js";

// Every request allocates megabytes of ArrayBuffers (encoded image, decoded pixels, tensors)
// around a small, steady JS heap. V8's adaptive heap growth then keeps the old-generation
// limit just above the live heap and runs a mark-compact every few requests (measured: 32-46
// per 200 ensemble requests, 140-180 ms of pauses); a fixed 4x growth factor cuts that to 5
// (55 ms). Set before any worker thread starts, so session and decode workers get it too.
v8.setFlagsFromString("--heap-growing-percent=300");
// User models may import @trellis/* by name with no node_modules of their own (as Triton lends
// triton_python_backend_utils): resolved from this install. Before any model loads.
lendOwnPackages(importInInstanceThreads);

/** Keepalive, age, ping and handshake bounds of gRPC connections, from their flags. */
function grpcConnectionOptions(flags: Flags): GrpcConnectionOptions {
  return {
    keepaliveTimeMs: flags.grpcKeepaliveTime,
    keepaliveTimeoutMs: flags.grpcKeepaliveTimeout,
    keepaliveWithoutCalls: flags.grpcKeepalivePermitWithoutCalls,
    maxAgeMs: flags.grpcMaxConnectionAge,
    maxAgeGraceMs: flags.grpcMaxConnectionAgeGrace,
    maxPingsWithoutData: flags.grpcHttp2MaxPingsWithoutData,
    minRecvPingIntervalMs: flags.grpcHttp2MinRecvPingIntervalWithoutData,
    maxPingStrikes: flags.grpcHttp2MaxPingStrikes,
    maxIdleMs: flags.grpcMaxConnectionIdle,
    handshakeTimeoutMs: flags.grpcHandshakeTimeout,
  };
}

type Settings = Awaited<ReturnType<typeof readCommandLine>>;
type Logger = ReturnType<typeof createServerLogger>["logger"];

/** The response cache --cache-config asks for: Redis (connected now), in-process, or none. */
async function responseCacheOf(settings: Settings, logger: Logger) {
  const cache = settings.responseCache;
  if (cache?.kind === "redis") {
    const { RedisResponseCache } = await import("./integrations/redis-cache.js");
    const redis: RedisResponseCache = await RedisResponseCache.connect(cache.settings, logger).catch((err: Error) => {
      throw new UsageError(`--cache-config redis: ${err.message}`);
    });
    return { store: redis, close: () => redis.close() };
  }
  return { store: cache?.kind === "local" ? new ResponseCache(cache.size) : undefined, close: () => {} };
}

async function repositoryManager(settings: Settings, logger: Logger, responseCache: ResponseStore | undefined) {
  const { flags, repositories } = settings;
  return new RepositoryManager({
    repositories,
    loader: modelLoader(settings.endpointsTls, {
      timeoutMs: flags.endpointsTimeoutSecs * 1000,
      keepaliveTimeMs: flags.endpointsKeepaliveTime,
      keepaliveTimeoutMs: flags.endpointsKeepaliveTimeout,
      logger,
    }),
    mode: flags.modelControlMode,
    loadModels: flags.loadModel,
    strictModelConfig: settings.strictModelConfig,
    loadConcurrency: flags.modelLoadThreadCount,
    loadRetries: flags.modelLoadRetryCount,
    rateLimiter: settings.rateLimiter,
    defaultMaxBatchSize: settings.defaultMaxBatchSize,
    defaultMaxQueueSize: flags.defaultMaxQueueSize,
    endpoints: flags.endpoints ? await readEndpointsFile(resolve(flags.endpoints)) : undefined,
    responseCache,
    strictReadiness: flags.strictReadiness,
    allowUnsafeLoadOverrides: flags.allowUnsafeLoadOverrides,
    maxInstancesPerModel: flags.maxInstancesPerModel,
    maxLoadFiles: flags.maxLoadFiles,
    maxLoadBytes: flags.maxLoadBytes,
    python: {
      pythonExecutable: flags.pythonExecutable,
      executeTimeoutMs: flags.pythonExecuteTimeoutSecs * 1000,
      maxFrameBytes: flags.pythonMaxAnswerBytes,
      maxStreamResponses: flags.pythonMaxResponses,
    },
    logger,
    pollIntervalMs: flags.repositoryPollSecs * 1000,
  });
}

/** SageMaker's and Vertex AI's listeners, where their flags switch them on (their modules only then). */
async function cloudEndpoints(settings: Settings, manager: RepositoryManager) {
  const { flags } = settings;
  let sagemaker: { port: number; options: SageMakerOptions } | undefined;
  let vertexAi: { port: number; options: Omit<VertexAiOptions, "metrics"> } | undefined;
  if (!flags.allowSagemaker && !flags.allowVertexAi) return { sagemaker, vertexAi };
  const cloud = await import("@trellis/frontends/cloud");
  if (flags.allowSagemaker) {
    try {
      const fromEnv = cloud.sageMakerOptionsFromEnv(process.env, () => manager.isReady());
      sagemaker = {
        port: flags.sagemakerPort,
        options: {
          ...fromEnv,
          models: sageMakerModels(manager),
          modelRoot: resolve(flags.sagemakerModelRoot),
          ...(settings.httpRestrictions ? { restrictions: settings.httpRestrictions } : {}),
        },
      };
    } catch (err) {
      throw new UsageError(`--allow-sagemaker: ${(err as Error).message}`);
    }
  }
  if (flags.allowVertexAi) {
    try {
      const routes = cloud.vertexAiRoutes(process.env);
      vertexAi = {
        port: flags.vertexAiPort,
        options: {
          ...routes,
          ready: () => manager.isReady(),
          // Checked once loading is done (see vertexAiProblem); the one model loaded when none is named.
          model: () => flags.vertexAiDefaultModel ?? manager.index(true)[0]?.name ?? "",
        },
      };
    } catch (err) {
      throw new UsageError(`--allow-vertex-ai: ${(err as Error).message}`);
    }
  }
  return { sagemaker, vertexAi };
}

/** The listeners' options, from the flags. */
async function serverOptions(
  settings: Settings,
  logger: Logger,
  logSettings: ReturnType<typeof createServerLogger>["settings"],
  cloud: Awaited<ReturnType<typeof cloudEndpoints>>,
): Promise<ServerOptions> {
  const { flags } = settings;
  return {
    serverName: flags.id,
    serverVersion: flags.serverVersion,
    host: flags.host,
    addresses: { http: flags.httpAddress, grpc: flags.grpcAddress, metrics: flags.metricsAddress },
    httpPort: flags.httpPort,
    grpcPort: flags.grpcPort,
    metricsPort: flags.metricsPort,
    httpMaxInputBytes: flags.httpMaxInputSize,
    httpMaxCompressedAnswerBytes: flags.httpMaxCompressedAnswerSize,
    grpcMaxInputBytes: flags.grpcMaxInputSize,
    maxInflightDecompressedBytes: flags.maxInflightDecompressedBytes,
    maxInflightBytesTensorBytes: flags.maxInflightBytesTensorBytes,
    grpcMaxUnreadAnswerBytes: flags.grpcMaxUnreadAnswerBytes,
    logger,
    logSettings,
    grpcTls: settings.grpcTls,
    allow: { http: flags.allowHttp, grpc: flags.allowGrpc, metrics: flags.allowMetrics },
    ui: flags.ui,
    repositories: settings.repositories,
    httpRestrictions: settings.httpRestrictions,
    grpcRestrictions: settings.grpcRestrictions,
    tracing: new Tracer(
      settings.tracing,
      logger,
      settings.otel && new (await import("./observability/otel.js")).OtelExport(settings.otel, logger),
      {
        recent: new RecentTraces(),
        // On-demand asks follow the trace endpoints' access rules, on either port.
        restrictions: [settings.httpRestrictions?.trace, settings.grpcRestrictions?.trace].filter(
          (r) => r !== undefined,
        ),
        ...traceAccess(settings),
      },
    ),
    metrics: { ...settings.metrics, cpuMetrics: flags.allowCpuMetrics, intervalMs: flags.metricsIntervalMs },
    forwardHeaders: { http: flags.httpHeaderForwardPattern, grpc: flags.grpcHeaderForwardPattern },
    grpcResponseCompression: flags.grpcInferResponseCompressionLevel,
    ...(cloud.sagemaker ? { sagemaker: cloud.sagemaker } : {}),
    ...(cloud.vertexAi ? { vertexAi: cloud.vertexAi } : {}),
    grpcConnections: grpcConnectionOptions(flags),
    httpTimeouts: {
      headersMs: flags.httpHeadersTimeout,
      requestMs: flags.httpRequestTimeout,
      keepAliveMs: flags.httpKeepaliveTimeout,
    },
    sharedMemory: flags.allowClientShm ? new SystemSharedMemory() : undefined,
  };
}

/**
 * Who may read and widen traces: the recent traces' routes are on the HTTP port; the trace
 * settings on every port that is on. A port that is off needs no key.
 */
function traceAccess({ flags, httpRestrictions, grpcRestrictions }: Settings) {
  const httpKeyed = !flags.allowHttp || httpRestrictions?.trace !== undefined;
  const grpcKeyed = !flags.allowGrpc || grpcRestrictions?.trace !== undefined;
  return { readersKeyed: httpKeyed, settingsKeyed: httpKeyed && grpcKeyed };
}

/**
 * SIGTERM: a graceful shutdown, first the drain window (--shutdown-drain-secs: not ready, still
 * answering, while load balancers stop sending here), then in-flight requests finish (at most
 * --exit-timeout-secs). SIGINT (Ctrl-C at a terminal, where no load balancer routes) skips the
 * window. A second signal exits at once. Returns whether shutdown has begun.
 */
function stopOnSignals(
  server: RunningServer,
  timing: { exitTimeoutMs: number; drainMs: number },
  logger: Logger,
  closeCache: () => void,
): () => boolean {
  let shuttingDown = false;
  const stop = (signal: string) => {
    if (shuttingDown) {
      logger.warn({ signal }, "second signal: exiting now");
      process.exit(1);
    }
    shuttingDown = true;
    logger.info({ signal }, "shutting down");
    const drainMs = signal === "SIGTERM" ? timing.drainMs : 0;
    server.shutdown(timing.exitTimeoutMs, drainMs).then(
      ({ timedOut }) => {
        closeCache();
        logger.info({ timedOut }, "stopped");
        process.exit(0);
      },
      (err) => {
        logger.error({ err: String(err) }, "shutdown failed");
        process.exit(1);
      },
    );
  };
  process.on("SIGINT", () => stop("SIGINT"));
  process.on("SIGTERM", () => stop("SIGTERM"));
  return () => shuttingDown;
}

/** As Triton: the Vertex AI endpoint needs its default model loaded, or a single model to default to. */
function vertexAiProblem(ready: string[], named: string | undefined): string | undefined {
  if (named) return ready.includes(named) ? undefined : `the default model '${named}' is not loaded`;
  const models = new Set(ready).size;
  return models === 1
    ? undefined
    : `with ${models} models loaded, name the one predictions go to: --vertex-ai-default-model <name>`;
}

/** Why the server must stop now that loading is done (--exit-on-error, the Vertex AI default model), if it must. */
function reasonToStop(settings: Settings, manager: RepositoryManager, vertexAi: boolean) {
  const { flags } = settings;
  const ready = manager
    .index(false)
    .filter((m) => m.state === "READY")
    .map((m) => m.name);
  const problem = vertexAi ? vertexAiProblem(ready, flags.vertexAiDefaultModel) : undefined;
  if (problem) {
    return {
      log: "the Vertex AI endpoint cannot serve: exiting",
      detail: { problem },
      message: `--allow-vertex-ai: ${problem}`,
    };
  }
  // Models asked for that failed (in explicit mode, a model not asked for does not count, as Triton's).
  const names = manager.failedModels();
  if (!flags.exitOnError || names.length === 0) return undefined;
  // Each model with why it failed, so the one line a supervisor (or the analyzer) keeps says it all.
  const rows = manager.index(false);
  const why = (name: string) =>
    rows
      .filter((r) => r.name === name && r.state === "UNAVAILABLE" && r.reason)
      .map((r) => r.reason)
      .join("; ");
  const listed = names.map((n) => (why(n) ? `'${n}' (${why(n)})` : `'${n}'`)).join(", ");
  return {
    log: "a model failed to load and --exit-on-error is set: exiting",
    detail: { failed: names },
    message: `${names.length === 1 ? "model" : "models"} ${listed} failed to load; exiting as --exit-on-error is true (Triton's default; --exit-on-error=false serves the rest, not ready)`,
  };
}

async function main(): Promise<void> {
  const settings = await readCommandLine();
  const { flags, repositories } = settings;
  const { logger, settings: logSettings } = createServerLogger({
    file: settings.logFile,
    verboseLevel: flags.logVerbose,
    info: flags.logInfo,
    warning: flags.logWarning,
    error: flags.logError,
    format: flags.logFormat,
    style: flags.logStyle ?? defaultLogStyle(settings.logFile),
  });
  for (const warning of settings.warnings) logger.warn(warning);

  await prepareSeedModels(repositories, logger, flags.fetchModels);
  const cache = await responseCacheOf(settings, logger);
  const manager = await repositoryManager(settings, logger, cache.store);
  const cloud = await cloudEndpoints(settings, manager);
  const server = await startServer(manager, await serverOptions(settings, logger, logSettings, cloud));
  const shuttingDown = stopOnSignals(
    server,
    { exitTimeoutMs: flags.exitTimeoutSecs * 1000, drainMs: flags.shutdownDrainSecs * 1000 },
    logger,
    cache.close,
  );

  await manager.start();
  // A signal during the initial load (e.g. while an ensemble waits for its remote steps) stops
  // the loads it interrupts: that is the signal's shutdown, not a failure to report.
  if (shuttingDown()) return;
  const index = manager.index(false);
  // The state of each; a failure's reason was logged once, when it failed.
  for (const m of index) logger.info({ model: m.name, version: m.version, state: m.state }, "model status");
  const stopping = reasonToStop(settings, manager, cloud.vertexAi !== undefined);
  if (stopping) {
    logger.error(stopping.detail, stopping.log);
    await server.shutdown(0);
    console.error(`trellis-server: ${stopping.message}`);
    process.exit(1);
  }
  logger.info(
    {
      ready: await manager.isReady(),
      models: index.filter((m) => m.state === "READY").length,
      failed: manager.failedModels().length,
      http: server.httpPort,
      grpc: server.grpcPort,
      metrics: server.metricsPort,
      ...(server.sagemakerPort !== undefined ? { sagemaker: server.sagemakerPort } : {}),
      ui: server.uiUrl,
    },
    "server started",
  );
}

main().catch((err) => {
  // Before the logger exists (bad flags) commander has already printed; this is for everything after.
  const opts = program.opts();
  const failure = startupFailure(err, {
    "--http-port": opts.httpPort,
    "--grpc-port": opts.grpcPort,
    "--metrics-port": opts.metricsPort,
    "--sagemaker-port": opts.allowSagemaker ? opts.sagemakerPort : undefined,
    "--vertex-ai-port": opts.allowVertexAi ? opts.vertexAiPort : undefined,
  });
  console.error(
    err instanceof UsageError || failure
      ? `trellis-server: ${failure ?? (err as Error).message}`
      : err instanceof Error
        ? err.stack
        : err,
  );
  process.exit(1);
});

/**
 * SageMaker's multi-model endpoint on the repository manager, as Triton's frontend does it:
 * each model's folder a repository registered for it (its folder served under SageMaker's
 * name), loaded, and on unload (or a failed load) unloaded with its steps and unregistered.
 */
function sageMakerModels(manager: RepositoryManager): SageMakerModelHost {
  return {
    async load(name, repository, folder) {
      await manager.registerRepository(repository, { [folder]: name });
      try {
        await manager.load(name);
      } catch (err) {
        await manager.unregisterRepository(repository);
        throw err;
      }
    },
    async unload(name, repository) {
      await manager.unload(name, { unloadDependents: true });
      await manager.unregisterRepository(repository);
    },
    isReady: (name) => manager.readyVersions(name).length > 0,
    async scan(repository) {
      const { models, errors } = await scanRepository([repository]);
      return {
        models: models.map((m) => ({
          name: m.name,
          folder: basename(m.modelDir),
          ensemble: m.config.schedulingChoice.case === "ensembleScheduling",
        })),
        unreadable: errors.map((e) => e.name),
      };
    },
  };
}
