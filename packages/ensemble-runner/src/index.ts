export {
  type CreateEnsembleOptions,
  createEnsemble,
  type EnsembleStage,
  EnsembleStepError,
  type ResolveStep,
  type StepStatistics,
} from "./ensemble.js";
export { connectRemote, type LoadStageOptions, loadStage, REMOTE_DEFAULTS, type RemoteOptions } from "./loader.js";
export type { EnsemblePlan, Producer, StepPlan } from "./plan.js";
export {
  type RepositoryModel,
  type RepositoryScan,
  type RepositorySource,
  readEndpointsFile,
  scanRepository,
} from "./repository.js";
