/**
 * @trellis/frontends/cloud: the routes SageMaker and Vertex AI containers serve, as thin adapters
 * over the HTTP/REST frontend's infer path. Imported only where their flags switch them on.
 */
export {
  type RepositoryListing,
  SAGEMAKER_BINARY_MIME,
  type SageMakerModelHost,
  type SageMakerOptions,
  sageMakerHandler,
  sageMakerOptionsFromEnv,
} from "./http/sagemaker.js";
export {
  VERTEX_AI_BINARY_MIME,
  type VertexAiOptions,
  vertexAiHandler,
  vertexAiRoutes,
} from "./http/vertex-ai.js";
