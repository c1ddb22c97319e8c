/**
 * The KServe v2 GRPCInferenceService and grpc.health.v1.Health implementations: each method a
 * small function over the registry, control calls through ../control.ts (as the HTTP/REST
 * frontend's), inference through ./infer.ts and the shared infer path.
 */
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import type { HandlerContext, ServiceImpl } from "@connectrpc/connect";
import { clientError, type ModelRegistry, normalizedModelConfig } from "@trellis/kserve";
import { metadataToWire, type SystemSharedMemory } from "@trellis/kserve/wire";
import {
  CudaSharedMemoryStatusResponseSchema,
  type GRPCInferenceService,
  type Health,
  HealthCheckResponseSchema,
  InferParameterSchema,
  type LogSettingsRequest,
  type LogSettingsResponse_SettingValueSchema,
  LogSettingsResponseSchema,
  ModelConfigResponseSchema,
  type ModelInferRequest,
  ModelInferResponseSchema,
  type ModelRepositoryParameter,
  type ModelStatistics,
  type ModelStatisticsRequest,
  ModelStatisticsResponseSchema,
  type ModelStreamInferResponse,
  ModelStreamInferResponseSchema,
  RepositoryIndexResponse_ModelIndexSchema,
  RepositoryIndexResponseSchema,
  ServerMetadataResponseSchema,
  HealthCheckResponse_ServingStatus as ServingStatus,
  SystemSharedMemoryStatusResponseSchema,
  type TraceSettingRequest,
  TraceSettingResponseSchema,
} from "@trellis/protocol";
import { Code, StageError } from "@trellis/stage";
import type { BytesInFlight } from "../bytes-in-flight.js";
import {
  loadModel,
  logSetting,
  modelReady,
  type RegisterFields,
  type RepositoryParameters,
  registerSharedMemory,
  repositoryIndex,
  type SharedMemoryKind,
  serverExtensions,
  serverReady,
  sharedMemoryRegions,
  statisticsStage,
  traceSetting,
  unloadModel,
  unregisterSharedMemory,
} from "../control.js";
import { forwardedHeaders } from "../header-forwarding.js";
import { loggingWithheld } from "../infer.js";
import type { LogSettingsControl, LogSettingValue } from "../log-settings.js";
import type { TraceControl } from "../trace-settings.js";
import {
  EMPTY_FINAL_RESPONSE,
  FINAL_RESPONSE,
  handleModelInfer,
  type ModelInferContext,
  streamModelInfer,
} from "./infer.js";

export interface ServeOptions {
  serverName?: string;
  serverVersion?: string;
  extensions?: string[];
  /** The logging extension's settings (LogSettings); without it the call answers UNIMPLEMENTED. */
  logSettings?: LogSettingsControl;
  /** The trace extension: samples requests and keeps the settings; without it tracing stays OFF. */
  tracing?: TraceControl;
  /** System shared memory regions clients may register and name in requests; without it, none can be. */
  sharedMemory?: SystemSharedMemory;
  /** The bound on BYTES tensors in flight (shared with other listeners when given one); without it, none. */
  bytesInFlight?: BytesInFlight;
  /** Headers of ModelInfer calls whose names match become request parameters (see header-forwarding.ts). */
  forwardHeaders?: RegExp;
  /** Hears of error detail withheld from a client (paths, addresses; see clientError), to log it. */
  logger?: { warn(obj: object, msg?: string): void };
}

/** What every method reads: the registry, the server's options, the withheld-detail log. */
interface Served {
  registry: ModelRegistry;
  options: ServeOptions;
  withheld: ((detail: string, sent: string) => void) | undefined;
}

/** What a Connect call tells the infer path: tracing, shared memory, its headers and the ones forwarded. */
function callContext({ options, withheld }: Served, ctx: HandlerContext): ModelInferContext {
  return {
    tracing: options.tracing,
    sharedMemory: options.sharedMemory,
    bytesInFlight: options.bytesInFlight,
    header: (name) => ctx.requestHeader.get(name) ?? undefined,
    forwarded: forwardedHeaders(options.forwardHeaders, ctx.requestHeader),
    withheld,
  };
}

/** A stream's answer flag saying whether it is its request's last. */
const finalFlag = (value: boolean) => ({
  [FINAL_RESPONSE]: create(InferParameterSchema, { parameterChoice: { case: "boolParam", value } }),
});

/**
 * One ModelStreamInfer stream, as Triton runs it: every request runs as soon as it arrives (so
 * they can batch together), and each is answered as it completes, in completion order (a
 * decoupled model's responses as it sends them); a failed one is answered with its error (and
 * its id) and the stream goes on.
 */
class InferStream {
  private readonly answered: ModelStreamInferResponse[] = [];
  private running = 0;
  private inputEnded = false;
  private inputError: unknown;
  private wake: (() => void) | undefined;

  constructor(
    private readonly served: Served,
    private readonly ctx: HandlerContext,
  ) {}

  /** The stream's answers, as its requests are read and answered. */
  async *answers(requests: AsyncIterable<ModelInferRequest>): AsyncGenerator<ModelStreamInferResponse> {
    void this.readAll(requests);
    for (;;) {
      const next = this.answered.shift();
      if (next) {
        yield next;
        continue;
      }
      if (this.inputEnded && this.running === 0) break;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
      });
      this.wake = undefined;
    }
    if (this.inputError) throw this.inputError;
  }

  private send(response: ModelStreamInferResponse): void {
    this.answered.push(response);
    this.wake?.();
  }

  /** Starts each request as it arrives; notes the end of the input, or its error. */
  private async readAll(requests: AsyncIterable<ModelInferRequest>): Promise<void> {
    try {
      for await (const msg of requests) {
        this.running++;
        void this.answerAll(msg).finally(() => {
          this.running--;
          this.wake?.();
        });
      }
    } catch (err) {
      this.inputError = err;
    } finally {
      this.inputEnded = true;
      this.wake?.();
    }
  }

  /**
   * Sends a request's answers. Triton's triton_enable_empty_final_response: each answer says
   * whether it is the request's last, as streaming clients wait for. A model answering once says
   * so on its answer; a decoupled one's answers say false, and an empty answer saying true
   * follows the last.
   */
  private async answerAll(msg: ModelInferRequest): Promise<void> {
    const asked = msg.parameters[EMPTY_FINAL_RESPONSE]?.parameterChoice;
    const flagged = asked?.case === "boolParam" && asked.value;
    const empty = () =>
      create(ModelInferResponseSchema, {
        id: msg.id,
        modelName: msg.modelName,
        modelVersion: msg.modelVersion,
        ...(flagged ? { parameters: finalFlag(true) } : {}),
      });
    const { registry, withheld } = this.served;
    try {
      const context = callContext(this.served, this.ctx);
      const { decoupled, responses } = streamModelInfer(registry, msg, this.ctx.signal, context);
      for await (const inferResponse of responses) {
        // The client went away: stop the model's responses (its iterator is returned) rather than queue them unread.
        if (this.ctx.signal.aborted) return;
        if (flagged) Object.assign(inferResponse.parameters, finalFlag(!decoupled));
        this.send(create(ModelStreamInferResponseSchema, { inferResponse }));
      }
      if (decoupled && flagged) this.send(create(ModelStreamInferResponseSchema, { inferResponse: empty() }));
    } catch (err) {
      const errorMessage = clientError(err, withheld).rawMessage;
      this.send(create(ModelStreamInferResponseSchema, { errorMessage, inferResponse: empty() }));
    }
  }
}

function serverMetadata({ registry, options }: Served) {
  return create(ServerMetadataResponseSchema, {
    name: options.serverName ?? "trellis",
    version: options.serverVersion ?? "0.1.0",
    extensions: options.extensions ?? lonelyExtensions(registry, options),
  });
}

async function modelStatistics({ registry }: Served, req: ModelStatisticsRequest) {
  const stages = req.name ? [statisticsStage(registry, req.name, req.version)] : registry.list();
  const stats: ModelStatistics[] = await Promise.all(stages.map((s) => s.statistics()));
  return create(ModelStatisticsResponseSchema, { modelStats: stats });
}

async function repositoryIndexMethod({ registry }: Served, ready: boolean) {
  const models = await repositoryIndex(registry, ready);
  return create(RepositoryIndexResponseSchema, {
    models: models.map((m) => create(RepositoryIndexResponse_ModelIndexSchema, m)),
  });
}

function systemSharedMemoryStatus({ options }: Served, name: string) {
  return create(SystemSharedMemoryStatusResponseSchema, {
    regions: Object.fromEntries(
      sharedMemoryRegions(options.sharedMemory, "system", name).map((r) => [
        r.name,
        { name: r.name, key: r.key, offset: BigInt(r.offset), byteSize: BigInt(r.byteSize) },
      ]),
    ),
  });
}

/** Register and unregister for one kind of shared memory. */
function sharedMemoryControl({ options }: Served, kind: SharedMemoryKind) {
  return {
    register: async (req: { name: string } & RegisterFields) => {
      await registerSharedMemory(options.sharedMemory, kind, req.name, () => req);
      return {};
    },
    unregister: (req: { name: string }) => {
      unregisterSharedMemory(options.sharedMemory, kind, req.name);
      return {};
    },
  };
}

function traceSettingMethod({ registry, options }: Served, req: TraceSettingRequest) {
  const settings = traceSetting(
    options.tracing,
    registry,
    req.modelName || undefined,
    Object.fromEntries(Object.entries(req.settings).map(([k, v]) => [k, v.value])),
  );
  return create(TraceSettingResponseSchema, {
    settings: Object.fromEntries(
      Object.entries(settings).map(([k, value]) => [k, { value: Array.isArray(value) ? value : [value] }]),
    ),
  });
}

function logSettingsMethod({ options }: Served, req: LogSettingsRequest) {
  const changes = Object.fromEntries(
    Object.entries(req.settings).flatMap(([k, v]) =>
      v.parameterChoice.case === undefined ? [] : [[k, v.parameterChoice.value] as const],
    ),
  );
  const settings = logSetting(options.logSettings, changes);
  return create(LogSettingsResponseSchema, {
    settings: Object.fromEntries(Object.entries(settings).map(([k, v]) => [k, settingToWire(v)])),
  });
}

/** The service's methods, each a call into the function that answers it; errors as a client may see them. */
export function inferenceService(
  registry: ModelRegistry,
  options: ServeOptions = {},
): Partial<ServiceImpl<typeof GRPCInferenceService>> {
  const served: Served = { registry, options, withheld: loggingWithheld(options.logger) };
  const system = sharedMemoryControl(served, "system");
  const cuda = sharedMemoryControl(served, "CUDA");
  return withClientErrors(served.withheld, {
    serverLive: () => ({ live: true }),
    serverReady: async () => ({ ready: await serverReady(registry) }),
    // A model the registry cannot find is not ready: tritonclient's is_model_ready pollers get False (HTTP answers 404).
    modelReady: async (req) => ({ ready: await modelReady(registry, req.name, req.version).catch(() => false) }),
    serverMetadata: () => serverMetadata(served),
    modelMetadata: async (req) => metadataToWire(await registry.resolve(req.name, req.version).metadata()),
    // As Triton answers it: normalized (version policy, backend, instance groups, ...).
    modelConfig: (req) =>
      create(ModelConfigResponseSchema, {
        config: normalizedModelConfig(registry.resolve(req.name, req.version).config),
      }),
    modelInfer: (msg, ctx) => handleModelInfer(registry, msg, ctx.signal, callContext(served, ctx)),
    async *modelStreamInfer(requests, ctx) {
      yield* new InferStream(served, ctx).answers(requests);
    },
    modelStatistics: (req) => modelStatistics(served, req),
    repositoryIndex: (req) => repositoryIndexMethod(served, req.ready),
    repositoryModelLoad: async (req) => {
      await loadModel(registry, req.modelName, parametersOf(req.parameters), (v) =>
        v instanceof Uint8Array ? v : undefined,
      );
      return {};
    },
    repositoryModelUnload: async (req) => {
      await unloadModel(registry, req.modelName, parametersOf(req.parameters));
      return {};
    },
    systemSharedMemoryStatus: (req) => systemSharedMemoryStatus(served, req.name),
    cudaSharedMemoryStatus: (req) => {
      sharedMemoryRegions(options.sharedMemory, "CUDA", req.name);
      return create(CudaSharedMemoryStatusResponseSchema);
    },
    systemSharedMemoryRegister: system.register,
    systemSharedMemoryUnregister: system.unregister,
    cudaSharedMemoryRegister: cuda.register,
    cudaSharedMemoryUnregister: cuda.unregister,
    traceSetting: (req) => traceSettingMethod(served, req),
    logSettings: (req) => logSettingsMethod(served, req),
  });
}

/**
 * `impl` with each method's errors as a client may see them (clientError: no paths or
 * addresses of the server's; `withheld` hears of the detail), streams' errors too.
 */
function withClientErrors<T extends object>(
  withheld: ((detail: string, sent: string) => void) | undefined,
  impl: T,
): T {
  const wrapped: Record<string, unknown> = {};
  for (const [name, method] of Object.entries(impl)) {
    if (typeof method !== "function") {
      wrapped[name] = method;
    } else if (method.constructor.name === "AsyncGeneratorFunction") {
      wrapped[name] = async function* (...args: unknown[]) {
        try {
          yield* method.apply(impl, args);
        } catch (err) {
          throw clientError(err, withheld);
        }
      };
    } else {
      wrapped[name] = async (...args: unknown[]) => {
        try {
          return await method.apply(impl, args);
        } catch (err) {
          throw clientError(err, withheld);
        }
      };
    }
  }
  return wrapped as T;
}

function settingToWire(v: LogSettingValue): MessageInitShape<typeof LogSettingsResponse_SettingValueSchema> {
  if (typeof v === "boolean") return { parameterChoice: { case: "boolParam", value: v } };
  if (typeof v === "number") return { parameterChoice: { case: "uint32Param", value: v } };
  return { parameterChoice: { case: "stringParam", value: v } };
}

/** A repository request's parameters, each the value its wire case carries. */
function parametersOf(parameters: { [key: string]: ModelRepositoryParameter }): RepositoryParameters {
  return Object.fromEntries(Object.entries(parameters).map(([k, v]) => [k, v.parameterChoice.value]));
}

/**
 * What a server with no extensions given lists: what it implements. Classification, sequence
 * batching and scheduling are the Trellis server's model runtime, not a lone stage's.
 */
function lonelyExtensions(registry: ModelRegistry, options: ServeOptions): string[] {
  return serverExtensions({
    repository: registry.repository !== undefined,
    systemSharedMemory: options.sharedMemory !== undefined,
    trace: options.tracing !== undefined,
    logging: options.logSettings !== undefined,
  });
}

export function healthService(registry: ModelRegistry): Partial<ServiceImpl<typeof Health>> {
  const status = async (service: string) => {
    if (service && service !== "inference.GRPCInferenceService") {
      throw new StageError(Code.NotFound, "", `unknown service "${service}"`);
    }
    return (await serverReady(registry)) ? ServingStatus.SERVING : ServingStatus.NOT_SERVING;
  };
  return {
    check: async (req) => create(HealthCheckResponseSchema, { status: await status(req.service) }),
    async *watch(req, ctx) {
      let last: ServingStatus | undefined;
      while (!ctx.signal.aborted) {
        const now = await status(req.service);
        if (now !== last) yield create(HealthCheckResponseSchema, { status: now });
        last = now;
        await new Promise((r) => setTimeout(r, 500));
      }
    },
  };
}
