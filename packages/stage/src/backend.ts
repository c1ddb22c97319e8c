export {
  configMaxQueueSize,
  DEFAULT_CPU_INSTANCE_COUNT,
  datatypeToConfig,
  groupInstanceCount,
  instanceGroupsOf,
  type ModelConfigSource,
  modelConfigOf,
} from "./config.js";
export {
  type CustomMetricKind,
  CustomMetrics,
  type CustomMetricsLimits,
  customMetrics,
  DEFAULT_CUSTOM_METRICS_LIMITS,
} from "./custom-metrics.js";
export {
  checkDefinition,
  computeOne,
  type DefinedStage,
  definitionOf,
  type ExecutionContext,
  isStageDefinition,
  pickOutputs,
} from "./define.js";
export { delegateStage, type StageOverrides } from "./delegate.js";
export {
  endedInstance,
  InstanceEndedError,
  type InstanceEnding,
  internal,
  invalidArgument,
  notFound,
  resourceExhausted,
  toConnectError,
  unavailable,
} from "./errors.js";
export { float16ArrayToFloat32, float16BitsToFloat32, float32ArrayToFloat16, float32ToFloat16Bits } from "./fp16.js";
export type { RateLimitedInstance, RateLimiterResource, RateLimiterSlot } from "./instances.js";
export { modelFilePath } from "./model-files.js";
export {
  countFramedElements,
  type FramingProblem,
  framedBytesOf,
  framedElements,
  frameElements,
  PACKED_MIN_ELEMENTS,
  packedBytes,
} from "./packed-bytes.js";
export { answersOf, decoupledRefusal } from "./stage.js";
export {
  type FirstResponseSample,
  type IsolationSample,
  observeFirstResponses,
  observeIsolation,
  observeRequests,
  type RequestObserver,
  type RequestSample,
} from "./statistics.js";
export {
  allocate,
  bytesOf,
  DATATYPES,
  elementSize,
  isDataType,
  type NumericType,
  randomData,
  type TensorDataMap,
  viewAs,
} from "./tensor.js";
export { deadlineTimer, MAX_TIMER_MS } from "./timer.js";
export { type TensorActivity, TRACE_REPLY_PARAMETER, type TraceActivity } from "./trace.js";
export {
  checkInferRequest,
  queueFullRefusal,
  type RequestInputSpec,
  type RequestSpec,
  requestPrefix,
  requestRefusal,
  tritonMessages,
} from "./triton-messages.js";
