/**
 * gRPC connection management, as gRPC core's server arguments that tritonserver
 * exposes: keepalive pings (a connection whose peer stops answering them is
 * closed, so a vanished client's calls do not hang on), ping policing (a client
 * pinging an idle connection too often is sent GOAWAY too_many_pings) and a
 * maximum connection age (clients reconnect from time to time, so a load
 * balancer in front sees new connections to spread). And the limits gRPC core
 * puts on connections that say nothing: a handshake timeout (the client's HTTP/2
 * preface and SETTINGS must come within it) and a maximum idle time (a connection
 * with no call for that long is closed with GOAWAY).
 */
import type http2 from "node:http2";

export interface GrpcConnectionOptions {
  /** Milliseconds between keepalive pings on a connection (tritonserver's --grpc-keepalive-time; default 2 h). */
  keepaliveTimeMs?: number;
  /** How long an answer to a ping may take before the connection is closed (--grpc-keepalive-timeout; default 20 s). */
  keepaliveTimeoutMs?: number;
  /** Ping connections with no call in flight too (--grpc-keepalive-permit-without-calls; default false). */
  keepaliveWithoutCalls?: boolean;
  /** Close a connection this long after it opened: GOAWAY, calls in flight finish (--grpc-max-connection-age). */
  maxAgeMs?: number;
  /** After the age is reached, how long calls in flight may take before the connection is cut (--grpc-max-connection-age-grace). */
  maxAgeGraceMs?: number;
  /** Keepalive pings sent before the server must have sent a call's headers or data again; 0: no limit (--grpc-http2-max-pings-without-data; default 2). */
  maxPingsWithoutData?: number;
  /** Shortest gap between a client's pings on a connection with no call that is not a strike, with keepaliveWithoutCalls (--grpc-http2-min-recv-ping-interval-without-data; default 5 min). */
  minRecvPingIntervalMs?: number;
  /** Strikes a client may earn before the connection is closed with GOAWAY too_many_pings; 0: no limit (--grpc-http2-max-ping-strikes; default 2). */
  maxPingStrikes?: number;
  /** Close a connection whose client has not sent its HTTP/2 preface and SETTINGS this long after it opened; 0: never (--grpc-handshake-timeout; default 20 s). */
  handshakeTimeoutMs?: number;
  /** Close a connection with no call in flight for this long, with GOAWAY; 0: never (--grpc-max-connection-idle; default 5 min). */
  maxIdleMs?: number;
}

export const DEFAULT_KEEPALIVE_TIME_MS = 7_200_000;
export const DEFAULT_KEEPALIVE_TIMEOUT_MS = 20_000;
export const DEFAULT_MAX_PINGS_WITHOUT_DATA = 2;
export const DEFAULT_MIN_RECV_PING_INTERVAL_MS = 300_000;
export const DEFAULT_MAX_PING_STRIKES = 2;
export const DEFAULT_HANDSHAKE_TIMEOUT_MS = 20_000;
export const DEFAULT_MAX_CONNECTION_IDLE_MS = 300_000;
/** gRPC core's floor for a client's pings on a connection with no call, unless such pings are permitted. */
const IDLE_PING_INTERVAL_MS = 7_200_000;
/** HTTP/2's ENHANCE_YOUR_CALM, the GOAWAY code gRPC core closes a ping-flooding connection with. */
const ENHANCE_YOUR_CALM = 0xb;

interface Logger {
  debug?(obj: object, msg?: string): void;
}

/** Applies `options` to one server session for as long as it lives. */
export function manageGrpcConnection(
  session: http2.ServerHttp2Session,
  options: GrpcConnectionOptions,
  logger?: Logger,
): void {
  const timers: NodeJS.Timeout[] = [];
  const later = (ms: number, fn: () => void, repeat = false) => {
    const timer = repeat ? setInterval(fn, ms) : setTimeout(fn, ms);
    // Neither keeps the process alive: shutdown closes sessions on its own terms.
    timer.unref();
    timers.push(timer);
  };
  let calls = 0;
  // A call's start and end are when the server sends headers and data, which node:http2 gives no
  // event for between them: the ping policies below count from those, and so err on the lenient side.
  let pingsSent = 0;
  let lastClientPing: number | undefined;
  let strikes = 0;
  const sentData = () => {
    pingsSent = 0;
    lastClientPing = undefined;
    strikes = 0;
  };
  // A connection with no call in flight for maxIdleMs is closed: destroy() sends GOAWAY (NO_ERROR, the
  // last stream it processed) first, so a client's call crossing it is known not to have run, and
  // then closes the socket outright (a graceful close would leave it half-open for as long as the
  // client likes).
  const maxIdleMs = options.maxIdleMs ?? DEFAULT_MAX_CONNECTION_IDLE_MS;
  let idle: NodeJS.Timeout | undefined;
  const idleFrom = () => {
    if (maxIdleMs <= 0) return;
    idle = setTimeout(() => {
      if (calls > 0 || session.destroyed) return;
      logger?.debug?.({ maxIdleMs }, "gRPC connection idle: GOAWAY");
      session.destroy();
    }, maxIdleMs);
    idle.unref();
  };
  idleFrom();
  session.on("stream", (stream) => {
    calls++;
    clearTimeout(idle);
    sentData();
    stream.once("close", () => {
      calls--;
      sentData();
      if (calls === 0) idleFrom();
    });
  });
  // The client's preface and SETTINGS (node:http2 reports the SETTINGS) must come within the handshake timeout.
  let greeted = false;
  session.once("remoteSettings", () => {
    greeted = true;
  });
  const handshakeMs = options.handshakeTimeoutMs ?? DEFAULT_HANDSHAKE_TIMEOUT_MS;
  if (handshakeMs > 0) {
    later(handshakeMs, () => {
      if (greeted || session.destroyed) return;
      logger?.debug?.({ handshakeMs }, "gRPC client sent no HTTP/2 preface in time: closing the connection");
      session.destroy();
    });
  }
  // gRPC core's ping policing, on connections with no call in flight (during a call the server
  // may be sending data unseen here, which would excuse the pings): pings closer together than
  // the interval are strikes, and past the strikes allowed the connection is closed.
  const maxStrikes = options.maxPingStrikes ?? DEFAULT_MAX_PING_STRIKES;
  const idleInterval = options.keepaliveWithoutCalls
    ? (options.minRecvPingIntervalMs ?? DEFAULT_MIN_RECV_PING_INTERVAL_MS)
    : IDLE_PING_INTERVAL_MS;
  session.on("ping", () => {
    if (calls > 0) return;
    const now = Date.now();
    if (lastClientPing !== undefined && now - lastClientPing < idleInterval) strikes++;
    lastClientPing = now;
    if (maxStrikes > 0 && strikes > maxStrikes && !session.destroyed) {
      logger?.debug?.({ strikes }, "gRPC client pings too often: GOAWAY too_many_pings");
      session.goaway(ENHANCE_YOUR_CALM, 0, Buffer.from("too_many_pings"));
      session.destroy();
    }
  });
  // The ping waiting for its acknowledgement, if any: past this timer the connection is closed.
  let unanswered: NodeJS.Timeout | undefined;
  session.once("close", () => {
    for (const timer of timers) clearTimeout(timer);
    clearTimeout(unanswered);
    clearTimeout(idle);
  });

  const timeoutMs = options.keepaliveTimeoutMs ?? DEFAULT_KEEPALIVE_TIMEOUT_MS;
  later(
    options.keepaliveTimeMs ?? DEFAULT_KEEPALIVE_TIME_MS,
    () => {
      if (unanswered || session.destroyed || session.closed) return;
      if (calls === 0 && !options.keepaliveWithoutCalls) return;
      const maxPings = options.maxPingsWithoutData ?? DEFAULT_MAX_PINGS_WITHOUT_DATA;
      if (maxPings > 0 && pingsSent >= maxPings) return;
      pingsSent++;
      const deadline = setTimeout(() => {
        logger?.debug?.({ timeoutMs }, "gRPC keepalive ping unanswered: closing the connection");
        session.destroy();
      }, timeoutMs);
      deadline.unref();
      unanswered = deadline;
      const answered = () => {
        clearTimeout(deadline);
        unanswered = undefined;
      };
      const sent = session.ping((err) => {
        answered();
        // A ping cancelled by the session closing is no sign of a dead peer.
        if (err) logger?.debug?.({ err: String(err) }, "gRPC keepalive ping failed");
      });
      if (!sent) answered();
    },
    true,
  );

  if (options.maxAgeMs !== undefined) {
    later(options.maxAgeMs, () => {
      if (session.destroyed || session.closed) return;
      logger?.debug?.({ maxAgeMs: options.maxAgeMs }, "gRPC connection reached its maximum age: GOAWAY");
      session.close();
      if (options.maxAgeGraceMs !== undefined) later(options.maxAgeGraceMs, () => session.destroy());
    });
  }
}
