export { connectRemote, type LoadStageOptions, loadStage, REMOTE_DEFAULTS, type RemoteOptions } from "./loader.js";
export {
  type RepositoryModel,
  type RepositoryScan,
  type RepositorySource,
  readEndpointsFile,
  scanRepository,
} from "./repository.js";
