/**
 * Triton's SageMaker endpoint (--allow-sagemaker), single-model mode: the two
 * routes a SageMaker container serves on its port (8080), for the model named
 * by SAGEMAKER_TRITON_DEFAULT_MODEL_NAME.
 *
 * - GET /ping: 200 while the server is ready (SAGEMAKER_TRITON_PING_MODE=live:
 *   while it is up), else 400, as Triton answers.
 * - POST /invocations: a KServe v2 inference request to that model, answered
 *   by the HTTP/REST frontend's own code: JSON tensors, or the binary tensor
 *   extension with the JSON header's length carried in the content type
 *   ("application/vnd.sagemaker-triton.binary+json;json-header-size=<n>"),
 *   as SageMaker passes bodies through without Triton's own header.
 *
 * Anything else (multi-model endpoints' /models routes among them) is 400.
 */
import { forwardTo, type Handler, sendError } from "./cloud-endpoint.js";

export const SAGEMAKER_BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size=";

export interface SageMakerOptions {
  /** SAGEMAKER_TRITON_DEFAULT_MODEL_NAME (undefined: /invocations says it is not set). */
  model?: string;
  /** SAGEMAKER_TRITON_PING_MODE: "ready" (default) or "live". */
  pingMode: "ready" | "live";
  ready(): Promise<boolean>;
}

/** The SageMaker settings from the environment, as Triton reads them. */
export function sageMakerOptionsFromEnv(env: NodeJS.ProcessEnv, ready: () => Promise<boolean>): SageMakerOptions {
  const pingMode = env.SAGEMAKER_TRITON_PING_MODE ?? "ready";
  if (pingMode !== "ready" && pingMode !== "live") {
    throw new Error(`SAGEMAKER_TRITON_PING_MODE=${pingMode}: expected ready or live`);
  }
  return { model: env.SAGEMAKER_TRITON_DEFAULT_MODEL_NAME || undefined, pingMode, ready };
}

/** The SageMaker routes, handing inference to `rest` (a REST handler made with SAGEMAKER_BINARY_MIME). */
export function sageMakerHandler(rest: Handler, options: SageMakerOptions): Handler {
  return (req, res) => {
    const path = (req.url ?? "/").split("?")[0];
    if (path === "/ping" && req.method === "GET") {
      const answer = (up: boolean) => {
        res.writeHead(up ? 200 : 400, { "content-length": 0 });
        res.end();
      };
      if (options.pingMode === "live") answer(true);
      else options.ready().then(answer, () => answer(false));
      return;
    }
    if (path !== "/invocations" || req.method !== "POST") {
      sendError(res, 400, `${req.method} ${path}: this SageMaker endpoint serves GET /ping and POST /invocations`);
      return;
    }
    if (!options.model) {
      sendError(res, 400, "SAGEMAKER_TRITON_DEFAULT_MODEL_NAME is not set: no model to invoke");
      return;
    }
    forwardTo(rest, req, res, `/v2/models/${encodeURIComponent(options.model)}/infer`);
  };
}
