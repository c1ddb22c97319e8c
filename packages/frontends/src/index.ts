/**
 * @trellis/frontends: the KServe v2 servers in front of a model registry. The gRPC frontend
 * (GRPCInferenceService plus health) and the HTTP/REST one (with Triton's binary tensors,
 * classification and generate) side by side, answering control calls
 * through one module (control.ts) and inference through one path (infer.ts: each frontend
 * supplies only its wire's decoder and encoder), so both give the same messages and codes. SageMaker's and
 * Vertex AI's routes over the HTTP frontend are under "@trellis/frontends/cloud".
 */
export {
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
  traceSetting,
  unloadModel,
  unregisterSharedMemory,
} from "./control.js";
export {
  DEFAULT_HANDSHAKE_TIMEOUT_MS,
  DEFAULT_KEEPALIVE_TIME_MS,
  DEFAULT_KEEPALIVE_TIMEOUT_MS,
  DEFAULT_MAX_CONNECTION_IDLE_MS,
  DEFAULT_MAX_PING_STRIKES,
  DEFAULT_MAX_PINGS_WITHOUT_DATA,
  DEFAULT_MIN_RECV_PING_INTERVAL_MS,
  type GrpcConnectionOptions,
  manageGrpcConnection,
} from "./grpc/connections.js";
export type { ResponseCompressionLevel } from "./grpc/response-compression.js";
export {
  createGrpcServer,
  DEFAULT_GRPC_MAX_INPUT_BYTES,
  type GrpcServerTlsOptions,
  inMemoryTransport,
  type ListeningServer,
  type ListenOptions,
  listenStage,
  serverCompression,
  serveStage,
} from "./grpc/serve.js";
export { forwardedHeaders, headerForwardPattern, withForwardedHeaders } from "./header-forwarding.js";
export { DEFAULT_HTTP_MAX_INPUT_BYTES, httpStatus, type RestContext, restHandler } from "./http/handler.js";
export type { LogSettings, LogSettingsControl, LogSettingValue } from "./log-settings.js";
export {
  API_CATEGORIES,
  type ApiCategory,
  type ApiRestrictions,
  parseRestriction,
  restrictionError,
  restrictionInterceptor,
} from "./restrictions.js";
export type { TraceControl, TraceSettings } from "./trace-settings.js";
