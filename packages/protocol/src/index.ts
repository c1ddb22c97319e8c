// Generated KServe v2 / Triton messages and services, plus config loading.

export {
  loadModelConfig,
  ModelConfigError,
  modelConfigToJson,
  parseModelConfig,
  parseModelConfigJson,
} from "./config.js";
export * from "./gen/grpc_service_pb.js";
export * from "./gen/health_pb.js";
export * from "./gen/model_config_pb.js";
