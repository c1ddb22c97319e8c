/**
 * The recent traces over HTTP, on the HTTP port beside the REST API (the "trace" endpoints
 * as --http-restricted-api names them, so restricted with them). Without that key they hold
 * only requests that asked to be traced, timestamps only (see TraceKeeping.readersKeyed):
 *
 *   GET /v2/traces[?request_id=<id>]   the kept traces, newest first (those of one request id)
 *   GET /v2/traces/<n>                 one trace: each step's timestamps (µs), batch size, failure
 *   GET /v2/traces/<n>/chrome          the same as Chrome trace-event JSON, as a download (Perfetto UI opens it)
 */
import type { IncomingMessage, ServerResponse } from "node:http";
import { type ApiRestrictions, restrictionError } from "@trellis/frontends";
import { chromeTraceOf, type RecentTraces } from "./recent-traces.js";

const PREFIX = "/v2/traces";

function send(res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": String(Buffer.byteLength(body)),
    "cache-control": "no-store",
    ...headers,
  });
  res.end(body);
}

const error = (res: ServerResponse, status: number, message: string) =>
  send(res, status, JSON.stringify({ error: message }));

/** A handler for the trace routes; false for any other path. */
export function traceRoutes(recent: RecentTraces, restrictions?: ApiRestrictions) {
  return (req: IncomingMessage, res: ServerResponse): boolean => {
    const url = new URL(req.url ?? "/", "http://localhost");
    const path = url.pathname;
    if (path !== PREFIX && !path.startsWith(`${PREFIX}/`)) return false;
    const refused = restrictionError(restrictions, "trace", (name) => {
      const value = req.headers[name];
      return Array.isArray(value) ? value[0] : value;
    });
    if (refused) {
      error(res, 403, refused.rawMessage);
      return true;
    }
    if (req.method !== "GET") {
      send(res, 405, JSON.stringify({ error: "the trace routes answer GET only" }), { allow: "GET" });
      return true;
    }
    if (path === PREFIX) {
      const requestId = url.searchParams.get("request_id");
      const traces = recent.list().filter((t) => requestId === null || t.requestId === requestId);
      send(res, 200, JSON.stringify({ traces, kept: { count: recent.count, bytes: recent.bytes, ...recent.bounds } }));
      return true;
    }
    const match = /^\/v2\/traces\/(\d{1,15})(\/chrome)?$/.exec(path);
    if (!match) {
      error(res, 404, "not a trace route: GET /v2/traces, /v2/traces/<id>, /v2/traces/<id>/chrome");
      return true;
    }
    const id = Number(match[1]);
    const json = recent.json(id);
    const trace = recent.find({ id });
    if (json === undefined || trace === undefined) {
      error(res, 404, `trace ${id} is not kept (only the most recent traces are)`);
      return true;
    }
    if (match[2]) {
      send(res, 200, JSON.stringify(chromeTraceOf(trace)), {
        "content-disposition": `attachment; filename="trellis-trace-${id}.json"`,
      });
    } else send(res, 200, json);
    return true;
  };
}
