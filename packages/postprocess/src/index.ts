export { type Classification, classify } from "./classify.js";
export { cFixed6, pyFloatRepr, pyJsonString } from "./format.js";
export { loadLabels, parseLabels } from "./labels.js";
export {
  createPostprocess,
  createStage,
  DEFAULT_INPUT,
  DEFAULT_LABEL_FILE,
  DEFAULT_OUTPUT,
  DEFAULT_TOP_K,
  type PostprocessOptions,
  PostprocessStage,
} from "./postprocess.js";
export { softmaxRowF32, topK } from "./softmax.js";
