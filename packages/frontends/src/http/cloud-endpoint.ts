/**
 * What the SageMaker and Vertex AI endpoints share: each listener answers
 * inference with a REST handler of its own, made with the platform's binary
 * content type (RestContext.binaryMime), and says what is wrong as the
 * HTTP/REST frontend does, as {"error": ...}.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { sendJson } from "./body.js";

export type Handler = (req: IncomingMessage, res: ServerResponse) => void;

export function sendError(res: ServerResponse, status: number, message: string): void {
  sendJson(res, status, { error: message });
}

/** Hands `req` to the endpoint's REST handler as a request for `path`. */
export function forwardTo(rest: Handler, req: IncomingMessage, res: ServerResponse, path: string): void {
  req.url = path;
  rest(req, res);
}
