export {
  type AutoCompleteOptions,
  autoCompleteConfig,
  checkConfigAgainstModel,
  type ModelIO,
} from "./model.js";
export { readOnnxMetadataProps } from "./onnx-file.js";
export {
  exclusiveCpu,
  type InstancePlan,
  type InstanceSessionOptions,
  planInstances,
  sessionOptions,
} from "./options.js";
export type { ModelTensorInfo } from "./protocol.js";
export {
  createOnnxModel,
  createOnnxStage,
  createStage,
  type OnnxDefinition,
  type OnnxModel,
  type OnnxStage,
  type OnnxStageOptions,
  SYNTHETIC_MARKER_FILE,
  SYNTHETIC_METADATA_KEY,
} from "./stage.js";
