export { ElementError, FAST_FORMATS, SEED_FORMATS, SUPPORTED_FORMATS, sniffFormat } from "./image.js";
export {
  type ChannelOrder,
  DEFAULT_PARAMETERS,
  type Encoding,
  type Layout,
  type Mode,
  type OutputDatatype,
  type PreprocessParameters,
  parametersFromConfig,
  resolveParameters,
} from "./options.js";
export { createPreprocess, createStage, type PreprocessOptions, preprocessDefinition } from "./stage.js";
