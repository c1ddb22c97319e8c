export { type AnalyzeOptions, type AnalyzeResult, analyze, thisMachine } from "./analyze.js";
export { type SweepPoint, scoreOf } from "./measure.js";
export { verdictLine } from "./report.js";
export { readEnsemble } from "./repository.js";
export type { Machine } from "./result.js";
export { beyondList, chooseWinner, type Finalist, judge, type Verdict } from "./rounds.js";
export type { Trial } from "./search.js";
export type { SearchSpace, StepSettings } from "./space.js";
export { applySettings, describeSettings, readSettings, searchSpace } from "./space.js";
