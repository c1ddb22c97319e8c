export { createMetrics, type Metrics } from "./observability/metrics.js";
export { EXTENSIONS, type Logger, type RunningServer, type ServerOptions, startServer } from "./server.js";
