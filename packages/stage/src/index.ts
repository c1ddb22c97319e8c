export { configInteger, configParameter, datatypeFromConfig, isDecoupled, metadataFromConfig } from "./config.js";
export { defineStage, type RequestOutcome, type StageDefinition, type StageFactory } from "./define.js";
export { Code, codeName, StageError } from "./errors.js";
export type { CpuGate, RateLimiter } from "./instances.js";
export type {
  InferOptions,
  InferRequest,
  InferResponse,
  ModelCaller,
  ModelCallOptions,
  Parameters,
  ParameterValue,
  RequestedOutput,
  Stage,
  StageFactoryOptions,
  StageLogger,
  StageMetadata,
  TensorMetadata,
} from "./stage.js";
export { type ExecutionTimes, nowNs, StatisticsRecorder } from "./statistics.js";
export {
  bytesTensor,
  bytesToStrings,
  type DataType,
  elementCount,
  formatShape,
  type Tensor,
  type TensorData,
  tensor,
} from "./tensor.js";
export { type RequestTrace, traceExecution } from "./trace.js";
