/**
 * @trellis/model-repository: Trellis's core. It reads Triton-layout model repositories, gives every
 * model (TypeScript stage, ONNX, ensemble, remote) its runtime in one place (loader.ts), and manages
 * them as Triton's repository manager does: version policies, load/unload, readiness, the queue
 * bound and the response cache. The frontends (@trellis/frontends) serve it as a ModelRegistry.
 */
export { configBoundsProblem, defaultMaxInstancesPerModel } from "./config-bounds.js";
export { modelLoader } from "./default-loader.js";
export { type LoadModelOptions, loadModel } from "./load-model.js";
export { type LoadStageOptions, loadStage } from "./loader.js";
export { classification, DEFAULT_MAX_QUEUE_SIZE, ManagedStage, type ModelCache } from "./managed-model.js";
export { RepositoryManager } from "./manager.js";
export {
  type ControlMode,
  DEFAULT_MAX_LOAD_BYTES,
  DEFAULT_MAX_LOAD_FILES,
  type ModelLoader,
  type RepositoryManagerOptions,
} from "./manager-options.js";
export { selectVersions } from "./registry.js";
export { connectRemote, REMOTE_DEFAULTS, type RemoteOptions } from "./remote.js";
export {
  type RepositoryModel,
  type RepositoryScan,
  type RepositorySource,
  readEndpointsFile,
  scanRepository,
} from "./scan.js";
export {
  compareAnswers,
  type OutputAgreement,
  SHADOW_MAX_IN_FLIGHT,
  type ShadowAgreement,
  ShadowComparer,
  type ShadowInterceptor,
  type ShadowResolver,
  type ShadowSettings,
  shadowAgreementOf,
  shadowInterceptor,
  shadowSettings,
} from "./shadow.js";
export { lendOwnPackages } from "./user-modules.js";
