export { clientError, clientMessage } from "./client-errors.js";
export {
  contentsFieldOf,
  frameBytes,
  tensorFromContents,
  tensorFromRaw,
  tensorToContents,
  tensorToRaw,
} from "./codec.js";
export {
  type Coding,
  compressionDeflate,
  DEFAULT_DECOMPRESSION_BUDGET_BYTES,
  DecompressionBudget,
  DecompressionBudgetExhausted,
  holdDecompressedUntilClose,
  inflateDeflate,
  inflateWithin,
} from "./compression.js";
export { normalizedModelConfig } from "./config-normalize.js";
export {
  type ClosableTransport,
  type ConnectStageOptions,
  connectStage,
  type GrpcTlsOptions,
  grpcTransport,
  remoteError,
} from "./connect.js";
export {
  checkLoadFilesInJson,
  loadModel,
  logSetting,
  modelReady,
  type RegisterFields,
  type RepositoryParameters,
  registerSharedMemory,
  repositoryIndex,
  type ServerAbilities,
  type SharedMemoryKind,
  serverExtensions,
  serverReady,
  sharedMemoryRegions,
  statisticsStage,
  TRITON_EXTENSIONS,
  tooManyLoadBytes,
  tooManyLoadFiles,
  traceSetting,
  unloadModel,
  unregisterSharedMemory,
} from "./control.js";
export { forwardedHeaders, headerForwardPattern, withForwardedHeaders } from "./header-forwarding.js";
export type { LogSettings, LogSettingsControl } from "./log-settings.js";
export { createModelCaller } from "./model-caller.js";
export type {
  ModelIndexEntry,
  ModelLoadLimits,
  ModelLoadOptions,
  ModelRegistry,
  ModelRepositoryControl,
  ModelUnloadOptions,
} from "./registry.js";
export {
  checkModelName,
  inferOptionsFromParameters,
  modelNameProblem,
  shownValue,
} from "./request-checks.js";
export type { ResponseCompressionLevel } from "./response-compression.js";
export {
  API_CATEGORIES,
  type ApiCategory,
  type ApiRestrictions,
  parseRestriction,
  restrictionError,
  restrictionInterceptor,
} from "./restrictions.js";
export {
  createGrpcServer,
  DEFAULT_GRPC_MAX_INPUT_BYTES,
  type GrpcServerTlsOptions,
  HTTP2_SETTINGS,
  type ListeningServer,
  type ListenOptions,
  listenStage,
  serverCompression,
  serveStage,
  widenSessionWindow,
} from "./serve.js";
export {
  type SharedMemoryRef,
  SystemSharedMemory,
  sharedMemoryNotTaken,
  sharedMemoryOutputParameters,
  sharedMemoryRef,
  withoutSharedMemory,
} from "./shared-memory.js";
export type { TraceControl, TraceSettings } from "./trace-settings.js";
export { connectionRefused, describeTransportError, neverSent } from "./transport-errors.js";
export { inferRequestToWire, inferResponseFromWire, inferResponseToWire, metadataFromWire } from "./wire.js";
