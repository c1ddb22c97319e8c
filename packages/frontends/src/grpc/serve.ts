/**
 * serveStage: any Stage (or a registry of them) as a KServe v2
 * GRPCInferenceService and grpc.health.v1.Health over Connect, so gRPC,
 * gRPC-Web and Connect clients all reach it from one handler.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { create, type MessageInitShape } from "@bufbuild/protobuf";
import { type ConnectRouter, createRouterTransport, type ServiceImpl, type Transport } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  clientError,
  inferOptionsFromParameters,
  type ModelRegistry,
  normalizedModelConfig,
  stageRegistry,
} from "@trellis/kserve";
import {
  type DecompressionBudget,
  HTTP2_SETTINGS,
  holdDecompressedUntilClose,
  inferRequestFromWire,
  inferResponseToWire,
  metadataToWire,
  namesSharedMemory,
  namingInputLimit,
  parametersFromWire,
  parametersToWire,
  requestCompression,
  type SharedMemoryRef,
  type SystemSharedMemory,
  sharedMemoryNotTaken,
  sharedMemoryOutputParameters,
  sharedMemoryRef,
  tensorFromContents,
  tensorToRaw,
  widenSessionWindow,
  withoutSharedMemory,
} from "@trellis/kserve/wire";
import {
  CudaSharedMemoryStatusResponseSchema,
  GRPCInferenceService,
  Health,
  HealthCheckResponseSchema,
  InferParameterSchema,
  type LogSettingsResponse_SettingValueSchema,
  LogSettingsResponseSchema,
  ModelConfigResponseSchema,
  type ModelInferRequest,
  ModelInferRequestSchema,
  type ModelInferResponse,
  ModelInferResponseSchema,
  type ModelRepositoryParameter,
  type ModelStatistics,
  ModelStatisticsResponseSchema,
  type ModelStreamInferResponse,
  ModelStreamInferResponseSchema,
  RepositoryIndexResponse_ModelIndexSchema,
  RepositoryIndexResponseSchema,
  ServerMetadataResponseSchema,
  HealthCheckResponse_ServingStatus as ServingStatus,
  SystemSharedMemoryStatusResponseSchema,
  TraceSettingResponseSchema,
} from "@trellis/protocol";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  type Parameters,
  type Stage,
  StageError,
} from "@trellis/stage";
import { answersOf } from "@trellis/stage/backend";
import {
  loadModel,
  logSetting,
  modelReady,
  type RepositoryParameters,
  registerSharedMemory,
  repositoryIndex,
  serverExtensions,
  serverReady,
  sharedMemoryRegions,
  statisticsStage,
  traceSetting,
  unloadModel,
  unregisterSharedMemory,
} from "../control.js";
import { forwardedHeaders, withForwardedHeaders } from "../header-forwarding.js";
import type { LogSettingsControl, LogSettingValue } from "../log-settings.js";
import { type ApiRestrictions, restrictionError, restrictionInterceptor } from "../restrictions.js";
import type { TraceControl } from "../trace-settings.js";
import { closeOnResetDrift, GRPC_SESSION_MEMORY_MB, ignoreIdleStreamFrames } from "./http2-resets.js";
import { guardRepositoryLoad, type LoadGuardOptions } from "./load-guard.js";
import { type GrpcCallTimes, grpcModelInferHandler, MODEL_INFER_PATH, withReadableGrpcMessage } from "./model-infer.js";
import { type ResponseCompressionLevel, responseAlgorithm } from "./response-compression.js";

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
  /** Headers of ModelInfer calls whose names match become request parameters (see header-forwarding.ts). */
  forwardHeaders?: RegExp;
  /** Hears of error detail withheld from a client (paths, addresses; see clientError), to log it. */
  logger?: { warn(obj: object, msg?: string): void };
}

/** A logger's report of error detail withheld from a client. */
export function loggingWithheld(
  logger: { warn(obj: object, msg?: string): void } | undefined,
): ((detail: string, sent: string) => void) | undefined {
  return logger && ((detail, sent) => logger.warn({ detail, sent }, "error detail withheld from the client"));
}

function asRegistry(x: Stage | ModelRegistry): ModelRegistry {
  return typeof (x as ModelRegistry).resolve === "function" ? (x as ModelRegistry) : stageRegistry(x as Stage);
}

/**
 * Options for one request from its KServe parameters (priority, timeout) and the call's signal;
 * those parameters, sequence_id, sequence_start and sequence_end refused when of the wrong type.
 */
function inferOptions(request: InferRequest, signal: AbortSignal, model: string): InferOptions {
  return { ...inferOptionsFromParameters(request.parameters, model), signal };
}

/** What a ModelInfer call has besides its message: tracing, what the call can tell, shared memory. */
export interface ModelInferContext {
  tracing?: TraceControl;
  /** Regions the request may name for its inputs and outputs. */
  sharedMemory?: SystemSharedMemory;
  /** The direct gRPC path's call: its read times go on the trace, which the path finishes once the answer is sent. */
  call?: GrpcCallTimes;
  /** The call's headers (a W3C traceparent continues the caller's trace). */
  header?: (name: string) => string | undefined;
  /** Parameters from the call's forwarded headers; the request's own parameters win over them. */
  forwarded?: Parameters;
  /** Hears of error detail withheld from the client (see clientError). */
  withheld?: (detail: string, sent: string) => void;
}

/** Triton's request parameter asking that a stream's last answer to the request say so, and the answer's flag. */
const EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response";
const FINAL_RESPONSE = "triton_final_response";

/**
 * Takes Triton's triton_enable_empty_final_response off the request: it is the stream's
 * setting (see modelStreamInfer), not the model's; refused unless it is a bool, as in Triton.
 */
function dropFinalResponseFlag(request: InferRequest, model: string): void {
  const value = request.parameters?.[EMPTY_FINAL_RESPONSE];
  if (value === undefined) return;
  if (typeof value !== "boolean") {
    throw new StageError(
      Code.InvalidArgument,
      model,
      `invalid value type for '${EMPTY_FINAL_RESPONSE}' parameter, expected bool_param`,
    );
  }
  const { [EMPTY_FINAL_RESPONSE]: _, ...rest } = request.parameters ?? {};
  request.parameters = Object.keys(rest).length > 0 ? rest : undefined;
}

/**
 * Runs one ModelInfer against the registry; `signal` is the call's. Errors come back as ConnectErrors.
 * With `tracing`, a sampled request is traced; with `sharedMemory`, it may name regions (see ModelInferContext).
 */
export async function handleModelInfer(
  registry: ModelRegistry,
  msg: ModelInferRequest,
  signal: AbortSignal,
  context: ModelInferContext = {},
): Promise<ModelInferResponse> {
  let call: ReturnType<typeof prepareModelInfer> | undefined;
  try {
    call = prepareModelInfer(registry, msg, signal, context);
    return call.encode(await call.stage.infer(call.request, call.options));
  } catch (err) {
    throw clientError(err, context.withheld);
  } finally {
    if (!context.call) call?.options.trace?.end();
  }
}

/**
 * One ModelStreamInfer request's answers: a decoupled model's responses as it sends them
 * (Stage.inferStream), else its one answer. Whether the model is decoupled is known before
 * the first answer, for the stream's final-response flags.
 */
function streamModelInfer(
  registry: ModelRegistry,
  msg: ModelInferRequest,
  signal: AbortSignal,
  context: ModelInferContext,
): { decoupled: boolean; responses: AsyncGenerator<ModelInferResponse> } {
  const { stage, request, options, encode } = prepareModelInfer(registry, msg, signal, context);
  async function* encoded() {
    try {
      for await (const answer of answersOf(stage, request, options)) yield encode(answer);
    } catch (err) {
      throw clientError(err, context.withheld);
    } finally {
      if (!context.call) options.trace?.end();
    }
  }
  return { decoupled: stage.inferStream !== undefined, responses: encoded() };
}

/** A ModelInfer request read for its stage (shared memory, forwarded headers, trace), and how its answers go back. */
function prepareModelInfer(
  registry: ModelRegistry,
  msg: ModelInferRequest,
  signal: AbortSignal,
  { tracing, call, header, sharedMemory, forwarded }: ModelInferContext,
): { stage: Stage; request: InferRequest; options: InferOptions; encode(response: InferResponse): ModelInferResponse } {
  const stage = registry.resolve(msg.modelName, msg.modelVersion);
  const shm = withSharedMemoryInputs(msg, sharedMemory);
  const request = inferRequestFromWire(shm.msg, stage.name);
  dropFinalResponseFlag(request, stage.name);
  if (forwarded) request.parameters = withForwardedHeaders(request.parameters, forwarded);
  const options = inferOptions(request, signal, stage.name);
  const trace = tracing?.begin(stage.name, stage.version, msg.id || undefined, header ?? call?.header);
  if (trace) {
    options.trace = trace;
    if (call) {
      trace.stamp("GRPC_WAITREAD_START", call.readStartNs);
      trace.stamp("GRPC_WAITREAD_END", call.readEndNs);
      call.trace = trace;
    }
  }
  const encode = (answer: InferResponse) => {
    const response = inferResponseToWire(answer);
    if (sharedMemory && shm.outputs.size > 0) writeSharedMemoryOutputs(response, shm.outputs, sharedMemory);
    return response;
  };
  return { stage, request, options, encode };
}

/**
 * The request with every input's bytes in raw_input_contents (those naming a shared memory
 * region read from it), and requested outputs without their shared_memory_* parameters, which
 * come back separately by output name. raw_input_contents may list only the inputs not in
 * shared memory (as tritonclient sends it) or one entry per input.
 */
function withSharedMemoryInputs(
  msg: ModelInferRequest,
  sharedMemory: SystemSharedMemory | undefined,
): { msg: ModelInferRequest; outputs: Map<string, SharedMemoryRef> } {
  const outputs = new Map<string, SharedMemoryRef>();
  // The common case, no region named, costs two key lookups per tensor.
  if (
    !msg.inputs.some((i) => namesSharedMemory(i.parameters)) &&
    !msg.outputs.some((o) => namesSharedMemory(o.parameters))
  ) {
    return { msg, outputs };
  }
  if (!sharedMemory) throw sharedMemoryNotTaken();
  const inputRefs = msg.inputs.map((i) => sharedMemoryRef(parametersFromWire(i.parameters), `input ${i.name}`));
  for (const o of msg.outputs) {
    const ref = sharedMemoryRef(parametersFromWire(o.parameters), `output ${o.name}`);
    if (ref) outputs.set(o.name, ref);
  }
  const raw = msg.rawInputContents;
  const inShm = inputRefs.filter(Boolean).length;
  const byIndex = raw.length === msg.inputs.length;
  if (raw.length > 0 && !byIndex && raw.length !== msg.inputs.length - inShm) {
    throw new StageError(
      Code.InvalidArgument,
      "",
      `raw_input_contents has ${raw.length} entries for ${msg.inputs.length} inputs, ${inShm} of them in shared memory`,
    );
  }
  let next = 0;
  const contents = msg.inputs.map((input, i) => {
    const ref = inputRefs[i];
    if (ref) {
      if (byIndex) next++;
      return sharedMemory.read(ref, `input ${input.name}`);
    }
    const bytes = raw.length > 0 ? raw[byIndex ? i : next++] : undefined;
    if (bytes) return bytes;
    // An input sent as typed contents, among others in shared memory: its bytes too.
    if (!input.contents) {
      throw new StageError(
        Code.InvalidArgument,
        "",
        `input ${input.name}: no data (neither contents nor raw_input_contents)`,
      );
    }
    return tensorToRaw(tensorFromContents("input", input, input.contents));
  });
  const requested = msg.outputs.map((o) =>
    outputs.has(o.name)
      ? { ...o, parameters: parametersToWire(withoutSharedMemory(parametersFromWire(o.parameters))) }
      : o,
  );
  return {
    msg: create(ModelInferRequestSchema, {
      ...msg,
      inputs: msg.inputs.map((i) => ({ ...i, contents: undefined })),
      outputs: requested,
      rawInputContents: contents,
    }),
    outputs,
  };
}

/** Writes each output the request placed in shared memory there; its answer says where, and carries no bytes. */
function writeSharedMemoryOutputs(
  response: ModelInferResponse,
  refs: Map<string, SharedMemoryRef>,
  sharedMemory: SystemSharedMemory,
): void {
  response.outputs.forEach((output, i) => {
    const ref = refs.get(output.name);
    if (!ref) return;
    const bytes = response.rawOutputContents[i] ?? new Uint8Array(0);
    sharedMemory.write(ref, bytes, `output ${output.name}`);
    output.parameters = {
      ...output.parameters,
      ...parametersToWire(sharedMemoryOutputParameters(ref, bytes.byteLength)),
    };
    // Kept in place (empty), so raw_output_contents stays one entry per output.
    response.rawOutputContents[i] = new Uint8Array(0);
  });
}

export function inferenceService(
  registry: ModelRegistry,
  options: ServeOptions = {},
): Partial<ServiceImpl<typeof GRPCInferenceService>> {
  const withheld = loggingWithheld(options.logger);
  return withClientErrors(withheld, {
    serverLive: () => ({ live: true }),
    serverReady: async () => ({ ready: await serverReady(registry) }),
    // A model the registry cannot find is not ready: tritonclient's is_model_ready pollers get False (HTTP answers 404).
    modelReady: async (req) => ({ ready: await modelReady(registry, req.name, req.version).catch(() => false) }),
    serverMetadata: () =>
      create(ServerMetadataResponseSchema, {
        name: options.serverName ?? "trellis",
        version: options.serverVersion ?? "0.1.0",
        extensions: options.extensions ?? lonelyExtensions(registry, options),
      }),
    modelMetadata: async (req) => metadataToWire(await registry.resolve(req.name, req.version).metadata()),
    // As Triton answers it: normalized (version policy, backend, instance groups, ...).
    modelConfig: (req) =>
      create(ModelConfigResponseSchema, {
        config: normalizedModelConfig(registry.resolve(req.name, req.version).config),
      }),
    modelInfer: (msg, ctx) =>
      handleModelInfer(registry, msg, ctx.signal, {
        tracing: options.tracing,
        sharedMemory: options.sharedMemory,
        header: (name) => ctx.requestHeader.get(name) ?? undefined,
        forwarded: forwardedHeaders(options.forwardHeaders, ctx.requestHeader),
        withheld,
      }),
    // As Triton does: every request on the stream runs as soon as it arrives (so they can
    // batch together), and each is answered as it completes, in completion order (a decoupled
    // model's responses as it sends them); a failed one is answered with its error (and its
    // id) and the stream goes on.
    async *modelStreamInfer(requests, ctx) {
      const answered: ModelStreamInferResponse[] = [];
      let running = 0;
      let inputEnded = false;
      let inputError: unknown;
      let wake: (() => void) | undefined;
      const send = (response: ModelStreamInferResponse) => {
        answered.push(response);
        wake?.();
      };
      const finalFlag = (value: boolean) => ({
        [FINAL_RESPONSE]: create(InferParameterSchema, { parameterChoice: { case: "boolParam", value } }),
      });
      const answerAll = async (msg: ModelInferRequest) => {
        // Triton's triton_enable_empty_final_response: each answer says whether it is the request's
        // last, as streaming clients wait for. A model answering once says so on its answer; a
        // decoupled one's answers say false, and an empty answer saying true follows the last.
        const asked = msg.parameters[EMPTY_FINAL_RESPONSE]?.parameterChoice;
        const flagged = asked?.case === "boolParam" && asked.value;
        const empty = () =>
          create(ModelInferResponseSchema, {
            id: msg.id,
            modelName: msg.modelName,
            modelVersion: msg.modelVersion,
            ...(flagged ? { parameters: finalFlag(true) } : {}),
          });
        try {
          const { decoupled, responses } = streamModelInfer(registry, msg, ctx.signal, {
            withheld,
            tracing: options.tracing,
            sharedMemory: options.sharedMemory,
            header: (name) => ctx.requestHeader.get(name) ?? undefined,
            forwarded: forwardedHeaders(options.forwardHeaders, ctx.requestHeader),
          });
          for await (const inferResponse of responses) {
            // The client went away: stop the model's responses (its iterator is returned) rather than queue them unread.
            if (ctx.signal.aborted) return;
            if (flagged) Object.assign(inferResponse.parameters, finalFlag(!decoupled));
            send(create(ModelStreamInferResponseSchema, { inferResponse }));
          }
          if (decoupled && flagged) send(create(ModelStreamInferResponseSchema, { inferResponse: empty() }));
        } catch (err) {
          send(
            create(ModelStreamInferResponseSchema, {
              errorMessage: clientError(err, withheld).rawMessage,
              inferResponse: empty(),
            }),
          );
        }
      };
      void (async () => {
        try {
          for await (const msg of requests) {
            running++;
            void answerAll(msg).finally(() => {
              running--;
              wake?.();
            });
          }
        } catch (err) {
          inputError = err;
        } finally {
          inputEnded = true;
          wake?.();
        }
      })();
      for (;;) {
        const next = answered.shift();
        if (next) {
          yield next;
          continue;
        }
        if (inputEnded && running === 0) break;
        await new Promise<void>((resolve) => {
          wake = resolve;
        });
        wake = undefined;
      }
      if (inputError) throw inputError;
    },
    modelStatistics: async (req) => {
      const stages = req.name ? [statisticsStage(registry, req.name, req.version)] : registry.list();
      const stats: ModelStatistics[] = await Promise.all(stages.map((s) => s.statistics()));
      return create(ModelStatisticsResponseSchema, { modelStats: stats });
    },
    repositoryIndex: async (req) =>
      create(RepositoryIndexResponseSchema, {
        models: (await repositoryIndex(registry, req.ready)).map((m) =>
          create(RepositoryIndexResponse_ModelIndexSchema, m),
        ),
      }),
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
    systemSharedMemoryStatus: (req) =>
      create(SystemSharedMemoryStatusResponseSchema, {
        regions: Object.fromEntries(
          sharedMemoryRegions(options.sharedMemory, "system", req.name).map((r) => [
            r.name,
            { name: r.name, key: r.key, offset: BigInt(r.offset), byteSize: BigInt(r.byteSize) },
          ]),
        ),
      }),
    cudaSharedMemoryStatus: (req) => {
      sharedMemoryRegions(options.sharedMemory, "CUDA", req.name);
      return create(CudaSharedMemoryStatusResponseSchema);
    },
    systemSharedMemoryRegister: async (req) => {
      await registerSharedMemory(options.sharedMemory, "system", req.name, () => req);
      return {};
    },
    systemSharedMemoryUnregister: (req) => {
      unregisterSharedMemory(options.sharedMemory, "system", req.name);
      return {};
    },
    cudaSharedMemoryRegister: async (req) => {
      await registerSharedMemory(options.sharedMemory, "CUDA", req.name, () => req);
      return {};
    },
    cudaSharedMemoryUnregister: (req) => {
      unregisterSharedMemory(options.sharedMemory, "CUDA", req.name);
      return {};
    },
    traceSetting: (req) => {
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
    },
    logSettings: (req) => {
      const changes = Object.fromEntries(
        Object.entries(req.settings).flatMap(([k, v]) =>
          v.parameterChoice.case === undefined ? [] : [[k, v.parameterChoice.value] as const],
        ),
      );
      const settings = logSetting(options.logSettings, changes);
      return create(LogSettingsResponseSchema, {
        settings: Object.fromEntries(Object.entries(settings).map(([k, v]) => [k, settingToWire(v)])),
      });
    },
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

/**
 * Connect routes serving `target` (one Stage or a registry) as KServe v2
 * gRPC plus health. Pass to connectNodeAdapter or createRouterTransport.
 */
export function serveStage(target: Stage | ModelRegistry, options: ServeOptions = {}) {
  const registry = asRegistry(target);
  return (router: ConnectRouter) => {
    router.service(GRPCInferenceService, inferenceService(registry, options));
    router.service(Health, healthService(registry));
  };
}

/** An in-process transport to a stage or registry: no sockets, same code path as a remote call. */
export function inMemoryTransport(target: Stage | ModelRegistry): Transport {
  return createRouterTransport(serveStage(target));
}

/**
 * Handler options for tensor traffic: requests compressed with gzip, deflate
 * (gRPC's two codings, both of which Triton takes) or br are accepted, each
 * inflated only up to the handler's readMaxBytes (a larger one is refused
 * RESOURCE_EXHAUSTED naming the limit and `maxInputFlag`, the setting that
 * raises it), but responses are never compressed. Tensors barely compress and
 * gzip on a megabyte response costs more than sending it over loopback or a
 * datacenter link (Triton does not compress by default either).
 */
export function serverCompression(
  maxInputFlag?: string,
  budget?: DecompressionBudget,
): {
  acceptCompression: Compression[];
  compressMinBytes: number;
} {
  return { acceptCompression: requestCompression(maxInputFlag, budget), compressMinBytes: Number.POSITIVE_INFINITY };
}

/** serverCompression() with refusals that name no setting. */
export const SERVER_COMPRESSION = serverCompression();

const INFER_PATHS = new Set([MODEL_INFER_PATH, "/inference.GRPCInferenceService/ModelStreamInfer"]);

/**
 * The largest gRPC request message accepted unless told otherwise: 64 MiB, the
 * default of Triton's --http-max-input-size, and so the same cap on both ports.
 * Triton's gRPC frontend takes up to INT32_MAX (2^31 - 1) bytes, a cap that
 * holds for compressed messages only once inflated: a 1 MB gzip message then
 * grew a server by over 2 GB and stalled it for seconds. A larger message
 * needs the cap raised (maxInputBytes, the server's --grpc-max-input-size).
 */
export const DEFAULT_GRPC_MAX_INPUT_BYTES = 64 * 1024 * 1024;

export interface GrpcServerOptions extends ServeOptions {
  /**
   * Largest request message accepted (default DEFAULT_GRPC_MAX_INPUT_BYTES), compressed
   * ones once inflated; a larger one is refused with RESOURCE_EXHAUSTED as soon as its
   * envelope's length prefix arrives (or, compressed, as soon as inflating passes it).
   */
  maxInputBytes?: number;
  /** The setting that raises maxInputBytes (e.g. "--grpc-max-input-size"), named in those refusals. */
  maxInputFlag?: string;
  /**
   * Bytes of decompressed messages held at once across all calls (shared with other listeners
   * when given one); each call's share is given back when it is answered. Without it, only
   * maxInputBytes bounds each message.
   */
  decompressionBudget?: DecompressionBudget;
  /** Serve over TLS (h2) instead of cleartext HTTP/2. */
  tls?: GrpcServerTlsOptions;
  /** Endpoint groups that require a header (tritonserver's --grpc-restricted-protocol). */
  restrictions?: ApiRestrictions;
  /**
   * Compress ModelInfer and ModelStreamInfer responses (tritonserver's
   * --grpc-infer-response-compression-level; default none), with the algorithm gRPC
   * core picks for the level among those the client accepts.
   */
  responseCompression?: ResponseCompressionLevel;
}

export interface GrpcServerTlsOptions {
  /** The server's certificate chain and private key (PEM). */
  cert: string | Buffer;
  key: string | Buffer;
  /** CA certificate(s) client certificates must chain to (mutual TLS). */
  ca?: string | Buffer;
  /** Refuse clients without a certificate that chains to `ca` (mutual TLS). Default false. */
  requireClientCert?: boolean;
}

export interface ListenOptions extends GrpcServerOptions {
  /** Interface to bind (default 127.0.0.1). */
  host?: string;
  /** Port to bind (default 0: an ephemeral port). */
  port?: number;
}

export interface ListeningServer {
  /** The bound port (useful with port 0). */
  port: number;
  host: string;
  /** Base URL for createGrpcTransport: http://, or https:// with TLS. */
  url: string;
  server: http2.Http2Server | http2.Http2SecureServer;
  /** Stops accepting and closes open sessions. */
  close(): Promise<void>;
}

export interface GrpcServer {
  server: http2.Http2Server | http2.Http2SecureServer;
  /** The HTTP/2 sessions open right now (for GOAWAY at shutdown). */
  sessions: ReadonlySet<http2.ServerHttp2Session>;
}

/**
 * An HTTP/2 server for `target` (gRPC, gRPC-Web and Connect, as serveStage;
 * cleartext, or TLS with `tls`), set up for tensor traffic: wide flow-control windows,
 * uncompressed responses, requests over `maxInputBytes` refused with
 * RESOURCE_EXHAUSTED. Unary ModelInfer over gRPC takes a direct path
 * (see grpc-model-infer.ts); everything else goes through Connect.
 */
export function createGrpcServer(
  target: Stage | ModelRegistry,
  {
    maxInputBytes = DEFAULT_GRPC_MAX_INPUT_BYTES,
    maxInputFlag,
    decompressionBudget,
    tls,
    restrictions,
    responseCompression = "none",
    ...options
  }: GrpcServerOptions = {},
): GrpcServer {
  const registry = asRegistry(target);
  const adapter = (compressMinBytes: number) =>
    connectNodeAdapter({
      routes: serveStage(registry, options),
      readMaxBytes: maxInputBytes,
      interceptors: restrictions ? [restrictionInterceptor(restrictions)] : [],
      ...serverCompression(maxInputFlag, decompressionBudget),
      compressMinBytes,
    });
  const connect = adapter(SERVER_COMPRESSION.compressMinBytes);
  // Inference responses through Connect (streams, compressed requests) compress at the level
  // set, the rest never: a second handler, told which algorithm to answer with.
  const connectInfer = responseCompression === "none" ? connect : adapter(0);
  const modelInfer = grpcModelInferHandler(
    (msg, signal, call) =>
      handleModelInfer(registry, msg, signal, {
        tracing: options.tracing,
        sharedMemory: options.sharedMemory,
        call,
        forwarded: options.forwardHeaders && forwardedHeaders(options.forwardHeaders, call.headers()),
        withheld: loggingWithheld(options.logger),
      }),
    maxInputBytes,
    restrictions &&
      ((headers) => restrictionError(restrictions, "inference", (h) => headers[h] as string | undefined, "grpc")),
    responseCompression,
    maxInputFlag,
  );
  const loadLimits = registry.repository?.loadLimits;
  const loadGuard: LoadGuardOptions | undefined = loadLimits && {
    limits: loadLimits,
    maxBytes: maxInputBytes,
    budget: decompressionBudget,
    refuse: restrictions
      ? (headers) => restrictionError(restrictions, "model-repository", (h) => headers[h] as string | undefined, "grpc")
      : undefined,
  };
  // What Connect inflates for a call stays reserved in the budget until the call is answered.
  const connectCall = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) =>
    decompressionBudget ? holdDecompressedUntilClose(res, () => viaConnect(req, res)) : viaConnect(req, res);
  const handle = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    if (modelInfer(req, res)) return;
    // A model load's parameters are counted before Connect decodes them (see grpc-load-guard.ts).
    if (loadGuard && guardRepositoryLoad(req, res, loadGuard, () => connectCall(req, res))) return;
    connectCall(req, res);
  };
  const viaConnect = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    // Connect writes its status trailers through addTrailers; grpc-js clients need grpc-message
    // encoded as the gRPC spec does (see encodeGrpcMessage), and its refusals of a message over
    // the cap name the setting that raises it.
    const addTrailers = res.addTrailers.bind(res);
    res.addTrailers = (trailers) => addTrailers(withReadableGrpcMessage(namingLimit(trailers, maxInputFlag)));
    if (connectInfer !== connect && INFER_PATHS.has(req.url)) {
      // Connect answers with the first encoding the client accepts: accept only gRPC core's pick.
      const accept = req.headers["grpc-accept-encoding"];
      req.headers["grpc-accept-encoding"] =
        responseAlgorithm(responseCompression, Array.isArray(accept) ? accept.join(",") : accept) ?? "identity";
      connectInfer(req, res);
      return;
    }
    connect(req, res);
  };
  const server = tls
    ? http2.createSecureServer(
        {
          settings: HTTP2_SETTINGS,
          maxSessionMemory: GRPC_SESSION_MEMORY_MB,
          cert: tls.cert,
          key: tls.key,
          ca: tls.ca,
          requestCert: tls.requireClientCert ?? false,
          rejectUnauthorized: tls.requireClientCert ?? false,
        },
        handle,
      )
    : http2.createServer({ settings: HTTP2_SETTINGS, maxSessionMemory: GRPC_SESSION_MEMORY_MB }, handle);
  // A client resetting its own calls must not break the connection its other calls share (see http2-resets.ts).
  ignoreIdleStreamFrames(server, !!tls);
  const sessions = new Set<http2.ServerHttp2Session>();
  server.on("session", (s) => {
    widenSessionWindow(s);
    closeOnResetDrift(s);
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
  });
  return { server, sessions };
}

/** `trailers` with Connect's refusal of a message over readMaxBytes reworded by namingInputLimit. */
function namingLimit(trailers: http2.OutgoingHttpHeaders, flag: string | undefined): http2.OutgoingHttpHeaders {
  const message = trailers["grpc-message"];
  if (String(trailers["grpc-status"]) !== String(Code.ResourceExhausted) || typeof message !== "string")
    return trailers;
  let text: string;
  try {
    text = decodeURIComponent(message);
  } catch {
    return trailers;
  }
  const named = namingInputLimit(text, flag);
  return named === text ? trailers : { ...trailers, "grpc-message": encodeURIComponent(named) };
}

/** Serves `target` over HTTP/2 (gRPC's transport; TLS with `tls`) on host:port (0 = ephemeral). */
export async function listenStage(
  target: Stage | ModelRegistry,
  { host = "127.0.0.1", port = 0, ...options }: ListenOptions = {},
): Promise<ListeningServer> {
  const { server, sessions } = createGrpcServer(target, options);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const bound = (server.address() as AddressInfo).port;
  return {
    port: bound,
    host,
    url: `${options.tls ? "https" : "http"}://${host.includes(":") ? `[${host}]` : host}:${bound}`,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sessions) s.close();
      }),
  };
}
