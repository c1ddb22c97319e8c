export { clientError, clientMessage } from "./client-errors.js";
export {
  contentsFieldOf,
  frameBytes,
  tensorFromContents,
  tensorFromRaw,
  tensorToContents,
  tensorToRaw,
} from "./codec.js";
export { compressionDeflate, inflateDeflate } from "./compression.js";
export { normalizedModelConfig } from "./config-normalize.js";
export {
  type ClosableTransport,
  type ConnectStageOptions,
  connectStage,
  type GrpcTlsOptions,
  grpcTransport,
  remoteError,
} from "./connect.js";
export { forwardedHeaders, headerForwardPattern, withForwardedHeaders } from "./header-forwarding.js";
export { answerLogSettings, type LogSettings, type LogSettingsControl } from "./log-settings.js";
export { createModelCaller } from "./model-caller.js";
export type {
  ModelIndexEntry,
  ModelLoadOptions,
  ModelRegistry,
  ModelRepositoryControl,
  ModelUnloadOptions,
} from "./registry.js";
export {
  checkFileOverridePath,
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
  statisticsStage,
  TRITON_EXTENSIONS,
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
export { answerTraceSettings, type TraceControl, type TraceSettings } from "./trace-settings.js";
export { describeTransportError, neverSent } from "./transport-errors.js";
export { refuseClientSharedMemory, refuseSharedMemoryRegister, sharedMemoryStatus } from "./unsupported.js";
export { inferRequestToWire, inferResponseFromWire, inferResponseToWire, metadataFromWire } from "./wire.js";
