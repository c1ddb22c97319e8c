/**
 * gRPC connection management, as gRPC core's server arguments that tritonserver
 * exposes: keepalive pings (a connection whose peer stops answering them is
 * closed, so a vanished client's calls do not hang on) and a maximum connection
 * age (clients reconnect from time to time, so a load balancer in front sees new
 * connections to spread).
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
}

export const DEFAULT_KEEPALIVE_TIME_MS = 7_200_000;
export const DEFAULT_KEEPALIVE_TIMEOUT_MS = 20_000;

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
  session.on("stream", (stream) => {
    calls++;
    stream.once("close", () => calls--);
  });
  // The ping waiting for its acknowledgement, if any: past this timer the connection is closed.
  let unanswered: NodeJS.Timeout | undefined;
  session.once("close", () => {
    for (const timer of timers) clearTimeout(timer);
    clearTimeout(unanswered);
  });

  const timeoutMs = options.keepaliveTimeoutMs ?? DEFAULT_KEEPALIVE_TIMEOUT_MS;
  later(
    options.keepaliveTimeMs ?? DEFAULT_KEEPALIVE_TIME_MS,
    () => {
      if (unanswered || session.destroyed || session.closed) return;
      if (calls === 0 && !options.keepaliveWithoutCalls) return;
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
