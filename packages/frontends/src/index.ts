/**
 * @trellis/frontends: the KServe v2 servers in front of a model registry. The gRPC frontend
 * (GRPCInferenceService plus health) and the HTTP/REST one (with Triton's binary tensors,
 * classification and generate) side by side, answering control calls
 * through one module (control.ts) and inference through one path (infer.ts: each frontend
 * supplies only its wire's decoder and encoder), so both give the same messages and codes. SageMaker's and
 * Vertex AI's routes over the HTTP frontend are under "@trellis/frontends/cloud".
 */
export {
  BYTES_ELEMENT_OVERHEAD,
  type BytesCost,
  BytesInFlight,
  BytesInFlightExhausted,
  bytesCostOf,
  DEFAULT_MAX_INFLIGHT_BYTES_TENSOR_BYTES,
} from "./bytes-in-flight.js";
export { type ServerAbilities, serverExtensions, TRITON_EXTENSIONS } from "./control.js";
export { type GrpcConnectionOptions, manageGrpcConnection } from "./grpc/connections.js";
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
export { DEFAULT_MAX_UNREAD_ANSWER_BYTES } from "./grpc/unread-answers.js";
export { headerForwardPattern } from "./header-forwarding.js";
export { DEFAULT_HTTP_MAX_INPUT_BYTES, httpStatus } from "./http/body.js";
export type { RestContext } from "./http/context.js";
export { restHandler } from "./http/handler.js";
export { DEFAULT_HTTP_MAX_COMPRESSED_ANSWER_BYTES } from "./http/infer.js";
export type { LogSettings, LogSettingsControl } from "./log-settings.js";
export {
  API_CATEGORIES,
  type ApiCategory,
  type ApiRestrictions,
  parseRestriction,
  type RestrictionFlag,
  restrictionError,
  restrictionInterceptor,
} from "./restrictions.js";
export type { TraceControl, TraceSettings } from "./trace-settings.js";
