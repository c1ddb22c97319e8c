export { type Classification, classify, formatClassification, type TopClass, topClasses } from "./classify.js";
export {
  connectEndpoint,
  DEFAULT_URLS,
  describeError,
  type Endpoint,
  type InferStream,
  type Protocol,
} from "./endpoint.js";
export { concreteShape, imageInput, imageRequests, randomRequest } from "./inputs.js";
export {
  concurrencyRange,
  formatResult,
  latencyReport,
  measure,
  measureRate,
  type PerfOptions,
  type PerfResult,
  type RatePerfOptions,
  type RequestDistribution,
  requestRateRange,
  type ServerSide,
} from "./perf.js";
