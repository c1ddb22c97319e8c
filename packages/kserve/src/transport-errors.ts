/**
 * Telling transport failures apart: a request that never left (safe to
 * resend), a connection that dropped under an in-flight request (the remote
 * is gone: UNAVAILABLE, as gRPC's own clients say), and a status the remote
 * actually sent (kept as it is).
 */
import { Code, ConnectError } from "@connectrpc/connect";

/** Node error codes raised while connecting, i.e. before any request byte left this process. */
const NOT_CONNECTED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"]);

/** Socket and HTTP/2 session failures under a request already sent. */
const DROPPED = new Set([
  "ECONNRESET",
  "EPIPE",
  "ERR_HTTP2_STREAM_ERROR",
  "ERR_HTTP2_SESSION_ERROR",
  "ERR_HTTP2_GOAWAY_SESSION",
  "ERR_HTTP2_INVALID_SESSION",
]);

/** The error and its causes, outermost first. */
function causes(err: unknown): unknown[] {
  const out: unknown[] = [];
  for (let e = err; e instanceof Error && !out.includes(e); e = (e as { cause?: unknown }).cause) out.push(e);
  return out;
}

const prop = (e: unknown, key: string) => (e as Record<string, unknown>)[key];

/** Content types of a Connect-protocol answer (an error in its JSON body or its end-of-stream message). */
const CONNECT_ANSWER = /^application\/(json|connect\+(proto|json))\b/;

/**
 * True when `err` is a status the server sent (gRPC's grpc-status in its trailers or headers, or a
 * Connect-protocol error body), not one the transport made up for a failed or dropped connection.
 * What ConnectError.isWireError says from @connectrpc/connect 2.2 on; those versions need Node 22,
 * and Trellis runs on Node 20, so it is told from the error's metadata.
 */
export function sentByServer(err: ConnectError): boolean {
  const { metadata } = err;
  if (metadata.has("grpc-status") || metadata.has("grpc-status-details-bin")) return true;
  return CONNECT_ANSWER.test(metadata.get("content-type") ?? "");
}

/** True when the request provably never reached the server, so sending it again cannot run it twice. */
export function neverSent(err: unknown): boolean {
  return causes(err).some((e) => {
    const code = prop(e, "code");
    return (
      (typeof code === "string" && NOT_CONNECTED.has(code)) ||
      prop(e, "syscall") === "connect" ||
      prop(e, "syscall") === "getaddrinfo" ||
      (e instanceof ConnectError && e.rawMessage === "connection establishment timed out")
    );
  });
}

/**
 * True when the connection dropped under an in-flight request. Node closes
 * orphaned HTTP/2 streams with CANCEL, which must not read as the caller's
 * cancellation (check the caller's signal first); a status the server sent
 * is never a lost connection.
 */
export function isConnectionLost(err: unknown): boolean {
  const errors = causes(err);
  if (errors.some((e) => e instanceof ConnectError && sentByServer(e))) return false;
  const ce = ConnectError.from(err);
  if (ce.code === Code.Canceled || ce.code === Code.Aborted) return true;
  return errors.some((e) => {
    const code = prop(e, "code");
    return typeof code === "string" && DROPPED.has(code);
  });
}

/** The innermost transport message plus the system error code under it (ECONNREFUSED and the like). */
export function describeTransportError(err: unknown): string {
  const msg = (
    causes(err)
      .filter((e) => e instanceof ConnectError)
      .at(-1) ?? ConnectError.from(err)
  ).rawMessage;
  const sys = causes(err)
    .map((e) => prop(e, "code"))
    .find((c): c is string => typeof c === "string" && /^E[A-Z]/.test(c));
  return sys && !msg.includes(sys) ? `${msg} (${sys})` : msg;
}
