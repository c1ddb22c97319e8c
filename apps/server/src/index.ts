export { classification, ManagedStage } from "./models/managed.js";
export {
  type ControlMode,
  type ModelLoader,
  RepositoryManager,
  type RepositoryManagerOptions,
  selectVersions,
} from "./models/repository.js";
export { createMetrics, type Metrics } from "./observability/metrics.js";
export { EXTENSIONS, type Logger, type RunningServer, type ServerOptions, startServer } from "./server.js";
