export type { QueueBound } from "./admission.js";
export {
  type BatchContext,
  type BatchingStrategy,
  type BatchResult,
  createDynamicBatcher,
  type QueueLevel,
  type ReportedTimes,
  type RequestsResult,
} from "./batcher.js";
export { CpuGate } from "./cpu-gate.js";
export {
  configBatchingStrategy,
  configRequestSpec,
  createModelRuntime,
  definitionBackend,
  instanceCount,
  type ModelBackend,
  type ModelRuntime,
  type ModelRuntimeOptions,
  stageBackend,
} from "./model-runtime.js";
export { RateLimiter, rateLimiterResources } from "./rate-limiter.js";
export { ResponseCache, type ResponseStore, responseCacheKey } from "./response-cache.js";
export {
  createSequenceBatcher,
  type SequenceBatcher,
  type SequenceTensorSpec,
  sequenceTensors,
  withSequenceBatching,
} from "./sequence-batcher.js";
export { definitionInstances, type ServeDefinitionOptions, serveDefinition } from "./serve-definition.js";
export { importInInstanceThreads, startWorkerInstances, type WorkerInstancesOptions } from "./worker-instances.js";
