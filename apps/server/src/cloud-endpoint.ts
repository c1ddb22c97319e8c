/**
 * What the SageMaker and Vertex AI endpoints share: inference handed to the
 * HTTP/REST frontend's own handler, with the binary tensor extension's header
 * length carried in the content type ("<mime prefix><n>") both ways, as those
 * platforms pass bodies through without Triton's Inference-Header-Content-Length.
 */
import type { IncomingMessage, ServerResponse } from "node:http";

const HEADER_LENGTH = "inference-header-content-length";

export type Handler = (req: IncomingMessage, res: ServerResponse) => void;

export function sendError(res: ServerResponse, status: number, message: string): void {
  const body = JSON.stringify({ error: message });
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

/**
 * Hands `req` to `rest` as a request for `path`, its binary header length read from a
 * content type starting with `mime` and the answer's written back the same way.
 */
export function forwardWithBinaryMime(
  rest: Handler,
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  mime: string,
): void {
  const contentType = req.headers["content-type"] ?? "";
  if (contentType.startsWith(mime)) {
    const size = contentType.slice(mime.length);
    if (!/^\d+$/.test(size)) {
      sendError(res, 400, `Unable to parse inference header size, got: ${size}`);
      return;
    }
    req.headers[HEADER_LENGTH] = size;
    req.headers["content-type"] = "application/octet-stream";
  } else if (contentType.includes(mime)) {
    sendError(res, 400, `expect MIME type for binary data starts with '${mime}', got: ${contentType}`);
    return;
  }
  req.url = path;
  const writeHead = res.writeHead.bind(res) as (status: number, headers?: Record<string, string | number>) => void;
  (res as { writeHead: unknown }).writeHead = (status: number, headers: Record<string, string | number> = {}) => {
    const { [HEADER_LENGTH]: length, ...rest } = headers;
    writeHead(status, length === undefined ? rest : { ...rest, "content-type": `${mime}${length}` });
    return res;
  };
  rest(req, res);
}
