export {
  type CreateEnsembleOptions,
  createEnsemble,
  type EnsembleStage,
  EnsembleStepError,
  type EnsembleTimes,
  type HeldStep,
  type HoldStep,
  type ResolveStep,
  type StepStatistics,
} from "./ensemble.js";
export { createPipeline, type PipelineFromConfig, type PipelineOptions, type PipelineStep } from "./pipeline.js";
export type { EnsemblePlan, Producer, StepPlan } from "./plan.js";
