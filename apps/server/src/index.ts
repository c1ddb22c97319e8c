export { classification, ManagedStage } from "./managed.js";
export { createMetrics, type Metrics } from "./metrics.js";
export {
  type ControlMode,
  type ModelLoader,
  RepositoryManager,
  type RepositoryManagerOptions,
  selectVersions,
} from "./repository.js";
export { EXTENSIONS, type Logger, type RunningServer, type ServerOptions, startServer } from "./server.js";
