export {
  type BatchContext,
  type BatchExecutor,
  type BatchingStrategy,
  type BatchResult,
  configMaxQueueSize,
  createDynamicBatcher,
  type DynamicBatcher,
  type DynamicBatcherOptions,
} from "./batcher.js";
export {
  checkHeader,
  contentsFieldOf,
  frameBytes,
  type TensorHeader,
  type TensorRole,
  tensorFromContents,
  tensorFromRaw,
  tensorToContents,
  tensorToRaw,
} from "./codec.js";
export { compressionDeflate, inflateDeflate } from "./compression.js";
export { normalizedModelConfig, SEQUENCE_IDLE_DEFAULT_MICROSECONDS } from "./config-normalize.js";
export {
  type ClosableTransport,
  type ConnectStageOptions,
  connectStage,
  type GrpcTlsOptions,
  grpcTransport,
  type InferenceClient,
  inMemoryTransport,
  remoteError,
} from "./connect.js";
export { CpuGate, processCpuGate } from "./cpu-gate.js";
export { defineStage, type StageDefinition } from "./define.js";
export {
  Code,
  clientError,
  clientMessage,
  codeName,
  internal,
  invalidArgument,
  notFound,
  resourceExhausted,
  StageError,
  toConnectError,
  unavailable,
} from "./errors.js";
export { float16ArrayToFloat32, float16BitsToFloat32, float32ArrayToFloat16, float32ToFloat16Bits } from "./fp16.js";
export { forwardedHeaders, headerForwardPattern, withForwardedHeaders } from "./header-forwarding.js";
export {
  answerLogSettings,
  type LogSettings,
  type LogSettingsControl,
  type LogSettingValue,
} from "./log-settings.js";
export { createModelCaller, type ModelCaller, type ModelCallOptions } from "./model-caller.js";
export { modelFilePath } from "./model-files.js";
export {
  type RateLimitedInstance,
  RateLimiter,
  type RateLimiterResource,
  type RateLimiterSlot,
  rateLimiterResources,
} from "./rate-limiter.js";
export {
  type ModelIndexEntry,
  type ModelLoadOptions,
  type ModelRegistry,
  type ModelRepositoryControl,
  type ModelUnloadOptions,
  stageRegistry,
} from "./registry.js";
export {
  checkFileOverridePath,
  checkModelName,
  inferOptionsFromParameters,
  modelNameProblem,
  shownValue,
} from "./request-checks.js";
export { ResponseCache, type ResponseCacheStats, type ResponseStore, responseCacheKey } from "./response-cache.js";
export {
  compressMessage,
  RESPONSE_COMPRESSION_LEVELS,
  type ResponseAlgorithm,
  type ResponseCompressionLevel,
  responseAlgorithm,
} from "./response-compression.js";
export {
  API_CATEGORIES,
  type ApiCategory,
  type ApiRestrictions,
  parseRestriction,
  restrictionError,
  restrictionInterceptor,
} from "./restrictions.js";
export {
  createSequenceBatcher,
  type SequenceBatcher,
  type SequenceBatcherOptions,
  type SequenceTensorSpec,
  sequenceTensors,
  withSequenceBatching,
} from "./sequence-batcher.js";
export {
  createGrpcServer,
  DEFAULT_GRPC_MAX_INPUT_BYTES,
  type GrpcServer,
  type GrpcServerOptions,
  type GrpcServerTlsOptions,
  HTTP2_SETTINGS,
  handleModelInfer,
  healthService,
  inferenceService,
  type ListeningServer,
  type ListenOptions,
  listenStage,
  type ModelInferContext,
  SERVER_COMPRESSION,
  type ServeOptions,
  serverCompression,
  serveStage,
  statisticsStage,
  TRITON_EXTENSIONS,
  widenSessionWindow,
} from "./serve.js";
export {
  namesSharedMemory,
  type SharedMemoryRef,
  type SharedMemoryRegion,
  SystemSharedMemory,
  sharedMemoryNotTaken,
  sharedMemoryOutputParameters,
  sharedMemoryRef,
  withoutSharedMemory,
} from "./shared-memory.js";
export type {
  InferOptions,
  InferRequest,
  InferResponse,
  Parameters,
  ParameterValue,
  RequestedOutput,
  Stage,
  StageFactory,
  StageFactoryOptions,
  StageLogger,
  StageMetadata,
  TensorMetadata,
} from "./stage.js";
export { answersOf, configInteger, configParameter, decoupledRefusal, isDecoupled } from "./stage.js";
export {
  type ExecutionTimes,
  type FirstResponseSample,
  nowNs,
  observeFirstResponses,
  observeRequests,
  type RequestObserver,
  type RequestSample,
  StatisticsRecorder,
} from "./statistics.js";
export * from "./tensor.js";
export {
  answerTraceSettings,
  type RequestTrace,
  type TensorActivity,
  type TraceActivity,
  type TraceControl,
  type TraceSettings,
  traceExecution,
} from "./trace.js";
export { describeTransportError, isConnectionLost, neverSent } from "./transport-errors.js";
export {
  checkInferRequest,
  type RequestInputSpec,
  type RequestSpec,
  requestPrefix,
  requestRefusal,
  tritonMessages,
} from "./triton-messages.js";
export {
  CLIENT_SHM_DISABLED,
  refuseClientSharedMemory,
  refuseSharedMemoryRegister,
  type SharedMemoryKind,
  sharedMemoryStatus,
} from "./unsupported.js";
export {
  datatypeFromConfig,
  datatypeToConfig,
  inferRequestFromWire,
  inferRequestToWire,
  inferResponseFromWire,
  inferResponseToWire,
  metadataFromConfig,
  metadataFromWire,
  metadataToWire,
  parametersFromWire,
  parametersToWire,
} from "./wire.js";
