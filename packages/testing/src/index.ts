export {
  type ClosedLoopOptions,
  type ClosedLoopResult,
  closedLoop,
  interleavedRounds,
  median,
  percentile,
} from "./bench.js";
export { type CpuTop5, numpyTop5, referenceTop5OnThisCpu, STABLE_TOP1, softmaxTop5 } from "./cpu-baseline.js";
export { rejectionOf } from "./errors.js";
export {
  type GrpcJsInferenceClient,
  type GrpcJsInferRequest,
  type GrpcJsInferResponse,
  type GrpcJsModelMetadata,
  type GrpcJsStreamResponse,
  type GrpcJsTensor,
  grpcJsInferenceClient,
  streamAll,
} from "./grpc-js.js";
export {
  ACCUMULATOR_CONFIG,
  accumulatorModel,
  GATHER_WEIGHTS,
  GATHER_WIDTH,
  gatherConfig,
  gatherModel,
  graphModel,
  identityModel,
  type ToyInitializer,
  type ToyNode,
  type ToyTensor,
} from "./onnx-writer.js";
export {
  fixtureImagesDir,
  fixturePhotos,
  LABELS_PATH,
  MOBILENET_PATH,
  modelsDir,
  protoDir,
  type ReferenceTop5,
  readFixtureImage,
  readReferenceTensor,
  readReferenceTop5,
  referenceDir,
  repoRoot,
  sharedDir,
  TLS_CERT_PATH,
  TLS_KEY_PATH,
  TRUNCATED_PHOTO,
} from "./paths.js";
export {
  findPythonGrpc,
  type PythonGrpcCall,
  type PythonGrpcResult,
  type PythonGrpcTls,
  type PythonKServeModel,
  type PythonKServeServer,
  pythonGrpcCalls,
  pythonGrpcRequired,
  startPythonKServe,
} from "./python-grpc.js";
export {
  makeSeedRepository,
  removeDir,
  type SeedRepositoryOptions,
  seedModelNames,
  seedPythonModelsMissing,
} from "./seed.js";
export { type ServerProcess, type ServerProcessOptions, startServerProcess, startupRefusal } from "./server-process.js";
