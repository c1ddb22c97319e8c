/**
 * Telling transport failures apart: a request that never left or that the
 * server refused before processing it (safe to resend), a connection that
 * dropped under an in-flight request (the remote is gone: UNAVAILABLE, as
 * gRPC's own clients say), and a status the remote actually sent (kept as it is).
 */
import http2 from "node:http2";
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

/**
 * Stream resets that mean the server did not process the stream: REFUSED_STREAM says so (RFC 9113
 * 8.7), and node:http2 servers reset a new stream with ENHANCE_YOUR_CALM when they cannot take it
 * (session memory or stream count over their cap). gRPC's clients resend such streams themselves.
 */
const REFUSED_CODES = new Set([http2.constants.NGHTTP2_REFUSED_STREAM, http2.constants.NGHTTP2_ENHANCE_YOUR_CALM]);

/** The errors of streams reset with one of REFUSED_CODES before any answer came. */
const refusedErrors = new WeakSet<object>();

/** How many times each request whose stream was refused was sent (set on the error it failed with). */
const refusedAttempts = new WeakMap<object, number>();

/** How many times a request refused before processing is sent again (immediately) before failing. */
export const REFUSED_STREAM_RESENDS = 2;

/**
 * Watches a client stream so that, if it is reset with REFUSED_STREAM or ENHANCE_YOUR_CALM before
 * its answer's headers came, its error is known as refused before processing (refusedBeforeProcessing).
 * Call before the stream is handed on. Sound only while this side refuses no answers itself: node's
 * client resets an answer with ENHANCE_YOUR_CALM when its session memory is over the cap, after the
 * server ran the request (grpcTransport lifts that cap).
 */
export function watchForRefusal(stream: http2.ClientHttp2Stream): void {
  let answered = false;
  stream.once("response", () => {
    answered = true;
  });
  stream.on("error", (err) => {
    if (!answered && stream.rstCode !== undefined && REFUSED_CODES.has(stream.rstCode)) refusedErrors.add(err);
  });
}

/** True when the server refused the request's stream before processing it: it did not run, and may be resent. */
export function refusedBeforeProcessing(err: unknown): boolean {
  return causes(err).some((e) => refusedErrors.has(e as object));
}

/** Records that the request failing with `err` (refused before processing) was sent `attempts` times. */
export function noteRefusedAttempts(err: unknown, attempts: number): void {
  if (err instanceof Error) refusedAttempts.set(err, attempts);
}

/** How many times the request failing with `err` was sent, each refused before processing; 1 if not recorded. */
export function refusedAttemptCount(err: unknown): number {
  for (const e of causes(err)) {
    const n = refusedAttempts.get(e as object);
    if (n !== undefined) return n;
  }
  return 1;
}

/** True when the connection was refused: nothing listens at the address. */
export function connectionRefused(err: unknown): boolean {
  return causes(err).some((e) => prop(e, "code") === "ECONNREFUSED");
}

/**
 * True when the request provably never reached the server, or the server refused it before
 * processing it (refusedBeforeProcessing), so sending it again cannot run it twice.
 */
export function neverSent(err: unknown): boolean {
  return causes(err).some((e) => {
    const code = prop(e, "code");
    return (
      refusedErrors.has(e as object) ||
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
