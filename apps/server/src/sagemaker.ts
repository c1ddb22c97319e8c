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
import type { IncomingMessage, ServerResponse } from "node:http";

export const SAGEMAKER_BINARY_MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size=";
const HEADER_LENGTH = "inference-header-content-length";

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

function sendError(res: ServerResponse, status: number, message: string): void {
  const body = JSON.stringify({ error: message });
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

/** The SageMaker routes, handing inference to `rest` (the HTTP/REST frontend's handler). */
export function sageMakerHandler(
  rest: (req: IncomingMessage, res: ServerResponse) => void,
  options: SageMakerOptions,
): (req: IncomingMessage, res: ServerResponse) => void {
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
    // The binary extension's header length comes in the content type here.
    const contentType = req.headers["content-type"] ?? "";
    if (contentType.startsWith(SAGEMAKER_BINARY_MIME)) {
      const size = contentType.slice(SAGEMAKER_BINARY_MIME.length);
      if (!/^\d+$/.test(size)) {
        sendError(res, 400, `Unable to parse inference header size, got: ${size}`);
        return;
      }
      req.headers[HEADER_LENGTH] = size;
      req.headers["content-type"] = "application/octet-stream";
    } else if (contentType.includes(SAGEMAKER_BINARY_MIME)) {
      sendError(
        res,
        400,
        `expect MIME type for binary data starts with '${SAGEMAKER_BINARY_MIME}', got: ${contentType}`,
      );
      return;
    }
    req.url = `/v2/models/${encodeURIComponent(options.model)}/infer`;
    // And the answer's header length goes back the same way.
    const writeHead = res.writeHead.bind(res) as (status: number, headers?: Record<string, string | number>) => void;
    (res as { writeHead: unknown }).writeHead = (status: number, headers: Record<string, string | number> = {}) => {
      const { [HEADER_LENGTH]: length, ...rest } = headers;
      writeHead(status, length === undefined ? rest : { ...rest, "content-type": `${SAGEMAKER_BINARY_MIME}${length}` });
      return res;
    };
    rest(req, res);
  };
}
