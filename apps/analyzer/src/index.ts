export { type AnalyzeOptions, type AnalyzeResult, analyze } from "./analyze.js";
export { type SweepPoint, scoreOf } from "./measure.js";
export { readEnsemble } from "./repository.js";
export { chooseWinner, type Finalist } from "./rounds.js";
export type { Trial } from "./search.js";
export type { SearchSpace, StepSettings } from "./space.js";
export { applySettings, describeSettings, readSettings, searchSpace } from "./space.js";
