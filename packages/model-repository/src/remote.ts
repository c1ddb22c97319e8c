/**
 * Remote models (--endpoints): connecting to a model another server serves over KServe v2 gRPC,
 * with each call's deadline and the connection's keepalive (RemoteOptions, REMOTE_DEFAULTS).
 */
import { type ConnectStageOptions, connectStage, type GrpcTlsOptions, grpcTransport } from "@trellis/kserve";
import type { Stage, StageLogger } from "@trellis/stage";
import { delegateStage } from "@trellis/stage/backend";

/** How remote models (--endpoints) are called. */
export interface RemoteOptions {
  /** Deadline of each call to the remote, in ms (a decoupled model's: of each response); 0: none. Default 30 s. */
  timeoutMs?: number;
  /** HTTP/2 keepalive ping after this many ms without a frame while calls are in flight; 0: none. Default 10 s. */
  keepaliveTimeMs?: number;
  /** A ping unanswered this long (ms) closes the connection, failing its calls UNAVAILABLE. Default 5 s. */
  keepaliveTimeoutMs?: number;
  /** Where a remote going away (and coming back) is logged, with its URL. */
  logger?: StageLogger;
}

export const REMOTE_DEFAULTS = { timeoutMs: 30_000, keepaliveTimeMs: 10_000, keepaliveTimeoutMs: 5_000 } as const;

/**
 * A remote model over KServe v2 gRPC; version "" lets the server choose.
 * Each call has a deadline and the connection a keepalive (see RemoteOptions);
 * readiness answers from the last known state, checked in the background, so
 * a health check never waits on the remote. Errors name the model, never its
 * URL (that goes to the log): a deadline is DEADLINE_EXCEEDED, a remote that
 * cannot be reached, dropped the connection, or does not have the model
 * loaded (restarting) is UNAVAILABLE, so callers can tell "that service is
 * down, retry" from a real error.
 */
export async function connectRemote(
  name: string,
  url: string,
  version = "",
  tls?: GrpcTlsOptions,
  remote: RemoteOptions = {},
): Promise<Stage> {
  const timeoutMs = remote.timeoutMs ?? REMOTE_DEFAULTS.timeoutMs;
  const keepaliveTimeMs = remote.keepaliveTimeMs ?? REMOTE_DEFAULTS.keepaliveTimeMs;
  const options: ConnectStageOptions = {
    redactTransportErrors: true,
    endpoint: url,
    cachedReadiness: {},
    ...(timeoutMs > 0 ? { timeoutMs } : {}),
    ...(remote.logger ? { logger: remote.logger } : {}),
  };
  if (version) options.version = version;
  const transport = grpcTransport(url, {
    ...(tls ? { tls } : {}),
    ...(keepaliveTimeMs > 0
      ? {
          keepalive: {
            timeMs: keepaliveTimeMs,
            timeoutMs: remote.keepaliveTimeoutMs ?? REMOTE_DEFAULTS.keepaliveTimeoutMs,
          },
        }
      : {}),
  });
  let stage: Stage;
  try {
    stage = await connectStage(transport, name, options);
  } catch (err) {
    transport.close();
    throw err;
  }
  // The stage owns its connection: closing it (unload, ensemble close) ends the HTTP/2 session.
  // Everything else is the remote stage's own (a decoupled model's inferStream included).
  return delegateStage(stage, {
    close: async () => {
      await stage.close();
      transport.close();
    },
  });
}

/** The remote options of a load, with its logger unless they name one. */
export const remoteOptions = (options: { logger?: StageLogger; remote?: RemoteOptions }): RemoteOptions => ({
  ...(options.logger ? { logger: options.logger } : {}),
  ...options.remote,
});
