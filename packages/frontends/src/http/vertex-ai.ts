/**
 * Triton's Vertex AI endpoint (--allow-vertex-ai): the routes Vertex AI
 * Prediction gives a custom container in AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE,
 * on AIP_HTTP_PORT (--vertex-ai-port).
 *
 * - the health route: 200 while the server is ready, else 400;
 * - the predict route (POST): a KServe v2 inference request to the default
 *   model (--vertex-ai-default-model, else the one model loaded), JSON or binary
 *   tensors with the header length in the content type
 *   ("application/vnd.vertex-ai-triton.binary+json;json-header-size=<n>"); with an
 *   X-Vertex-Ai-Triton-Redirect header naming a KServe v2 / Triton endpoint
 *   ("v2/models/m/infer", "v2/models/m/config", "v2/repository/index",
 *   "metrics", ...), that endpoint instead, since Vertex AI only sends POSTs to
 *   the predict route.
 *
 * Anything else is 400, as Triton answers.
 */
import { forwardTo, type Handler, sendError } from "./cloud-endpoint.js";

export const VERTEX_AI_BINARY_MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size=";
export const VERTEX_AI_REDIRECT_HEADER = "x-vertex-ai-triton-redirect";

export interface VertexAiOptions {
  predictRoute: string;
  healthRoute: string;
  /** The model predictions go to (checked loaded at start). */
  model(): string;
  ready(): Promise<boolean>;
  /** The Prometheus text, for a redirect to "metrics". */
  metrics(): Promise<string>;
}

/** The routes from the environment Vertex AI sets; both are required, as in Triton. */
export function vertexAiRoutes(env: NodeJS.ProcessEnv): { predictRoute: string; healthRoute: string } {
  const predictRoute = env.AIP_PREDICT_ROUTE;
  const healthRoute = env.AIP_HEALTH_ROUTE;
  if (!predictRoute) throw new Error("AIP_PREDICT_ROUTE is not defined for the Vertex AI endpoint");
  if (!healthRoute) throw new Error("AIP_HEALTH_ROUTE is not defined for the Vertex AI endpoint");
  return { predictRoute, healthRoute };
}

/** Endpoints a redirect may name that take a POST; every other one is read with a GET. */
const POSTED =
  /^\/v2\/(models\/[^/]+(\/versions\/[^/]+)?\/(infer|generate|generate_stream)|repository\/.*|(system|cuda)sharedmemory\/.*\/(register|unregister)|logging|trace\/setting|models\/[^/]+\/trace\/setting)$/;

/** The Vertex AI routes, handing requests to `rest` (a REST handler made with VERTEX_AI_BINARY_MIME). */
export function vertexAiHandler(rest: Handler, options: VertexAiOptions): Handler {
  return (req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (path === options.healthRoute) {
      options.ready().then(
        (up) => {
          res.writeHead(up ? 200 : 400, { "content-length": 0 });
          res.end();
        },
        () => sendError(res, 400, "readiness unknown"),
      );
      return;
    }
    if (path !== options.predictRoute) {
      sendError(
        res,
        400,
        `${req.method} ${path}: this Vertex AI endpoint serves ${options.healthRoute} and ${options.predictRoute}`,
      );
      return;
    }
    if (req.method !== "POST") {
      sendError(res, 405, `${req.method} ${path}: the predict route takes POST`);
      return;
    }
    const redirect = req.headers[VERTEX_AI_REDIRECT_HEADER];
    if (typeof redirect !== "string") {
      forwardTo(rest, req, res, `/v2/models/${encodeURIComponent(options.model())}/infer`);
      return;
    }
    const target = `/${redirect.replace(/^\/+/, "")}`;
    if (target === "/metrics") {
      options.metrics().then(
        (text) => {
          res.writeHead(200, { "content-type": "text/plain; version=0.0.4; charset=utf-8" });
          res.end(text);
        },
        (err: Error) => sendError(res, 500, err.message),
      );
      return;
    }
    if (!target.startsWith("/v2")) {
      sendError(res, 400, `${VERTEX_AI_REDIRECT_HEADER}: ${redirect}: expected a KServe v2 endpoint or metrics`);
      return;
    }
    if (!POSTED.test(target)) req.method = "GET";
    forwardTo(rest, req, res, target);
  };
}
