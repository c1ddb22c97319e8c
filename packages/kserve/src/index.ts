/**
 * @trellis/kserve: KServe v2 for Trellis stages: a remote model as a Stage (connectStage), the
 * registry the frontends serve, and the checks and messages every KServe request shares. Protocol
 * detail (tensor codecs, wire messages, compression, shared memory, HTTP/2 settings) is under
 * "@trellis/kserve/wire"; the servers themselves are in @trellis/frontends.
 */
export { clientError, clientMessage } from "./client-errors.js";
export { normalizedModelConfig } from "./config-normalize.js";
export {
  type ClosableTransport,
  type ConnectStageOptions,
  connectStage,
  type GrpcTlsOptions,
  grpcTransport,
  type InferenceClient,
  remoteError,
} from "./connect.js";
export { checkLoadFilesInJson, tooManyLoadBytes, tooManyLoadFiles } from "./load-limits.js";
export { createModelCaller } from "./model-caller.js";
export {
  acquireModel,
  type HeldModel,
  type ModelIndexEntry,
  type ModelLoadLimits,
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
  modelNameRefusal,
  shownValue,
} from "./request-checks.js";
export {
  connectionRefused,
  describeTransportError,
  isConnectionLost,
  neverSent,
  REFUSED_STREAM_RESENDS,
} from "./transport-errors.js";
