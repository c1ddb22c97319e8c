/**
 * The KServe v2 HTTP/REST frontend with Triton's extensions (binary tensor data, classification,
 * statistics, model repository). Plain node:http: the route table (routes.ts) is small and fixed;
 * this dispatches a request to its route, after the restricted-API check.
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { restrictionError } from "../restrictions.js";
import { HttpError, headerOf, sendError } from "./body.js";
import { type RestContext, RestFrontend } from "./context.js";
import { findRoute } from "./routes.js";

/** A path segment percent-decoded whole (400 for a malformed escape): `%3A` is ':', `%2F` a '/' within the name. */
function decodedSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    throw new HttpError(400, `malformed percent-encoding in path segment ${segment}`);
  }
}

/**
 * Answers one request: 403 when its group is restricted, 404 for no route, 405 for a method the
 * route does not take. Routes match the path as sent, so an encoded '/' never separates
 * segments; each captured segment (a model's name, its version, a region) is then decoded fully,
 * as tritonclient percent-encodes names.
 */
async function dispatch(rest: RestFrontend, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const path = (req.url ?? "/").split("?")[0] ?? "/";
  const found = findRoute(path);
  const category = found.route ? found.route.category : found.category;
  const refused = restrictionError(rest.ctx.restrictions, category, (h) => headerOf(req, h));
  if (refused) throw new HttpError(403, refused.rawMessage);
  if (!found.route) throw new HttpError(404, "Not Found");
  if (!found.route.methods.includes(req.method ?? "")) throw new HttpError(405, "Method Not Allowed");
  const match = found.match;
  for (let i = 1; i < match.length; i++) {
    const group = match[i];
    if (group !== undefined) match[i] = decodedSegment(group);
  }
  await found.route.handle({ rest, req, res, match });
}

/** A request handler for the REST API; answers 404 for paths it does not know. */
export function restHandler(ctx: RestContext) {
  const rest = new RestFrontend(ctx);
  return (req: IncomingMessage, res: ServerResponse): void => {
    dispatch(rest, req, res).catch((err) => {
      ctx.logger.debug({ url: req.url, err: String(err) }, "request failed");
      sendError(res, err, rest.withheld);
    });
  };
}
