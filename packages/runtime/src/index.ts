export type { QueueBound } from "./admission.js";
export { definitionBackend, type ModelBackend, stageBackend } from "./backend.js";
export { CpuGate } from "./cpu-gate.js";
export {
  importInInstanceThreads,
  startWorkerInstances,
  type WorkerInstancesOptions,
} from "./instances/worker-instances.js";
export { cacheInterceptor, type ModelCache } from "./interceptors/cache.js";
export type {
  InferNext,
  InterceptedModel,
  ModelInterceptor,
  StreamNext,
} from "./interceptors/chain.js";
export { classification, classificationInterceptor } from "./interceptors/classification.js";
export { tracingInterceptor } from "./interceptors/tracing.js";
export { Model } from "./model.js";
export {
  configBatchingStrategy,
  configRequestSpec,
  createModel,
  createModelRuntime,
  instanceCount,
  type ModelOptions,
  type ModelRuntime,
  type ModelRuntimeOptions,
} from "./model-runtime.js";
export { RateLimiter, rateLimiterResources } from "./rate-limiter.js";
export { ResponseCache, type ResponseStore, responseCacheKey } from "./response-cache.js";
export {
  type BatchContext,
  type BatchingStrategy,
  type BatchResult,
  createDynamicBatcher,
  type QueueLevel,
  type ReportedTimes,
  type RequestsResult,
} from "./schedulers/dynamic/batcher.js";
export {
  createSequenceBatcher,
  type SequenceBatcher,
  type SequenceTensorSpec,
  sequenceTensors,
  withSequenceBatching,
} from "./schedulers/sequence/batcher.js";
export { definitionInstances, type ServeDefinitionOptions, serveDefinition } from "./serve-definition.js";
