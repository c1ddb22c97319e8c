export {
  type BatchContext,
  type BatchExecutor,
  type BatchResult,
  createDynamicBatcher,
  type DynamicBatcher,
  type DynamicBatcherOptions,
} from "./batcher.js";
export {
  checkHeader,
  frameBytes,
  type TensorHeader,
  type TensorRole,
  tensorFromContents,
  tensorFromRaw,
  tensorToContents,
  tensorToRaw,
} from "./codec.js";
export {
  type ConnectStageOptions,
  connectStage,
  type GrpcTlsOptions,
  grpcTransport,
  type InferenceClient,
  inMemoryTransport,
  remoteError,
} from "./connect.js";
export {
  Code,
  codeName,
  internal,
  invalidArgument,
  notFound,
  resourceExhausted,
  StageError,
  toConnectError,
  unavailable,
} from "./errors.js";
export { type ModelIndexEntry, type ModelRegistry, type ModelRepositoryControl, stageRegistry } from "./registry.js";
export {
  handleModelInfer,
  healthService,
  inferenceService,
  type ListeningServer,
  listenStage,
  type ServeOptions,
  serveStage,
} from "./serve.js";
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
export { configParameter } from "./stage.js";
export { type ExecutionTimes, nowNs, StatisticsRecorder } from "./statistics.js";
export * from "./tensor.js";
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
