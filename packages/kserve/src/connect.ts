/**
 * connectStage: a Stage backed by any KServe v2 gRPC endpoint (a Trellis
 * stage service or a real Triton), used exactly like a local one.
 */

import type http2 from "node:http2";
import { type Client, ConnectError, createClient, type Interceptor, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import {
  GRPCInferenceService,
  type ModelConfig,
  type ModelStatistics,
  type ModelStreamInferResponse,
} from "@trellis/protocol";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  isDecoupled,
  type Stage,
  StageError,
  type StageLogger,
  type StageMetadata,
} from "@trellis/stage";
import { TRACE_REPLY_PARAMETER } from "@trellis/stage/backend";
import { HTTP2_SETTINGS, widenSessionWindow } from "./http2-settings.js";
import {
  describeTransportError,
  isConnectionLost,
  neverSent,
  noteRefusedAttempts,
  REFUSED_STREAM_RESENDS,
  refusedAttemptCount,
  refusedBeforeProcessing,
  sentByServer,
  watchForRefusal,
} from "./transport-errors.js";
import { inferRequestToWire, inferResponseFromWire, metadataFromWire } from "./wire.js";

export type InferenceClient = Client<typeof GRPCInferenceService>;

/** TLS material for an https:// endpoint (PEM); omitted fields use Node's defaults. */
export interface GrpcTlsOptions {
  /** CA certificate(s) to trust instead of the system store. */
  ca?: string | Buffer;
  /** Client certificate and key, for servers that require mutual TLS. */
  cert?: string | Buffer;
  key?: string | Buffer;
}

/**
 * Connect's session manager, widening each new connection's receive window for large tensors and
 * watching each stream for a refusal before processing (watchForRefusal).
 */
class WideWindowSessionManager extends Http2SessionManager {
  private readonly widened = new WeakSet<http2.Http2Session>();

  override async request(
    ...args: Parameters<Http2SessionManager["request"]>
  ): ReturnType<Http2SessionManager["request"]> {
    const stream = await super.request(...args);
    watchForRefusal(stream);
    const session = stream.session;
    if (session && !this.widened.has(session)) {
      this.widened.add(session);
      widenSessionWindow(session);
    }
    return stream;
  }
}

/**
 * Sends a unary call again, at once, when the server refused its stream before processing it
 * (REFUSED_STREAM, or ENHANCE_YOUR_CALM before any answer), up to REFUSED_STREAM_RESENDS times; the
 * error of the last refusal records how many times it was sent. Streaming calls are not resent:
 * their request messages have been read.
 */
const resendRefused: Interceptor = (next) => async (req) => {
  if (req.stream) return next(req);
  for (let attempt = 1; ; attempt++) {
    try {
      return await next(req);
    } catch (err) {
      if (!refusedBeforeProcessing(err) || req.signal.aborted) throw err;
      if (attempt > REFUSED_STREAM_RESENDS) {
        noteRefusedAttempts(err, attempt);
        throw err;
      }
    }
  }
};

/** A transport that owns its HTTP/2 connection: close() ends it (and any call still on it). */
export interface ClosableTransport extends Transport {
  close(): void;
}

/**
 * HTTP/2 keepalive on a connection to a remote: while calls are in flight (and before a call on a
 * connection idle longer than `timeMs`) a PING goes out after `timeMs` without a frame from the
 * peer; one unanswered for `timeoutMs` closes the connection, failing its calls UNAVAILABLE, so a
 * peer that stopped answering (frozen, or gone without a FIN) is found without waiting on deadlines.
 * Idle connections are not pinged: servers (gRPC core's, Trellis's) count such pings as abuse.
 */
export interface GrpcKeepalive {
  timeMs: number;
  timeoutMs: number;
}

/** A gRPC transport (HTTP/2) to a KServe v2 endpoint such as "http://127.0.0.1:8001" (or https:// with `tls`). */
export function grpcTransport(
  baseUrl: string,
  options: {
    headers?: Record<string, string>;
    tls?: GrpcTlsOptions;
    connectTimeoutMs?: number;
    /** Default: no keepalive pings. */
    keepalive?: GrpcKeepalive;
  } = {},
): ClosableTransport {
  const headers = options.headers;
  const sessionManager = new WideWindowSessionManager(
    baseUrl,
    {
      ...(options.connectTimeoutMs !== undefined ? { connectTimeoutMs: options.connectTimeoutMs } : {}),
      ...(options.keepalive
        ? {
            pingIntervalMs: options.keepalive.timeMs,
            pingTimeoutMs: options.keepalive.timeoutMs,
            pingIdleConnection: false,
          }
        : {}),
    },
    // No cap on the session's memory, as in gRPC's own Node client (grpc-js). On a client, node counts
    // the request bytes still waiting to be sent against it (node's default is 10 MB), and once over
    // the cap it resets the answers that come in with ENHANCE_YOUR_CALM, though the server ran their
    // requests: a few concurrent batches of images are enough. What the cap would bound here is the
    // caller's own tensors, already in memory; what the server sends stays bounded by the windows.
    { settings: HTTP2_SETTINGS, maxSessionMemory: Number.MAX_SAFE_INTEGER, ...options.tls },
  );
  const transport = createGrpcTransport({
    baseUrl,
    sessionManager,
    // Tensors barely compress; asking for gzip only costs CPU on both ends.
    acceptCompression: [],
    interceptors: [
      resendRefused,
      ...(headers
        ? [
            ((next) => (req) => {
              for (const [k, v] of Object.entries(headers)) req.header.set(k, v);
              return next(req);
            }) satisfies Interceptor,
          ]
        : []),
    ],
  });
  // Without this an unloaded remote step keeps its idle connection open for Connect's 15-minute idle timeout.
  return Object.assign(transport, { close: () => sessionManager.abort() });
}

export interface ConnectStageOptions {
  /** Version to address; "" lets the server choose. */
  version?: string;
  /** Label used in errors, e.g. the endpoint URL. */
  remoteLabel?: string;
  /**
   * Per-request deadline in milliseconds (for a decoupled model: for each of its responses):
   * past it the request fails DEADLINE_EXCEEDED naming the model. Default: none.
   */
  timeoutMs?: number;
  /**
   * Requests whose transport failed (connection refused, lost, ping unanswered) fail UNAVAILABLE
   * saying so, without the transport's own text, which can name addresses; `logger` gets it.
   * A status the remote sent is passed on as it is (NOT_FOUND as UNAVAILABLE: see infer).
   */
  redactTransportErrors?: boolean;
  /** Where failures are logged (with `endpoint`), each time the remote starts or stops failing. */
  logger?: StageLogger;
  /** Where the remote is, for the log only. */
  endpoint?: string;
  /**
   * isReady() answers at once with the last known state, never waiting on the remote: a state
   * older than `refreshMs` (default 1000) starts a check in the background, one at a time, which
   * counts as not ready past `timeoutMs` (default 5000, or the request deadline if shorter). The
   * first check is made before connectStage returns. Default: each isReady() asks the remote.
   */
  cachedReadiness?: { refreshMs?: number; timeoutMs?: number };
}

/** A remote's readiness, known without waiting on it: checks run in the background, one at a time. */
class ReadinessCache {
  private ready = false;
  private checkedAt = 0;
  private checking: Promise<void> | undefined;

  constructor(
    private readonly check: (timeoutMs: number) => Promise<boolean>,
    private readonly refreshMs: number,
    private readonly timeoutMs: number,
    private readonly changed: (ready: boolean, why?: unknown) => void,
  ) {}

  /** The last known state; starts a check when it is older than refreshMs. */
  get(): boolean {
    if (!this.checking && Date.now() - this.checkedAt >= this.refreshMs) void this.refresh();
    return this.ready;
  }

  /** Checks now (or joins the check under way); resolves once the state is known. */
  refresh(): Promise<void> {
    this.checking ??= this.check(this.timeoutMs)
      .then(
        (ready) => this.set(ready),
        (err: unknown) => this.set(false, err),
      )
      .finally(() => {
        this.checkedAt = Date.now();
        this.checking = undefined;
      });
    return this.checking;
  }

  private set(ready: boolean, why?: unknown): void {
    if (ready !== this.ready) this.changed(ready, why);
    this.ready = ready;
  }
}

/** Re-raises a remote error with its code, saying which remote model raised it. */
export function remoteError(err: unknown, model: string, remoteLabel: string): StageError {
  const ce = ConnectError.from(err);
  const where = remoteLabel ? `remote model ${model} at ${remoteLabel}` : `remote model ${model}`;
  return new StageError(ce.code, model, `${where}: ${ce.rawMessage}`, { cause: err });
}

/** A call's own deadline (if any) joined to its caller's signal: `expired` tells the two apart. */
function callDeadline(outer: AbortSignal | undefined, ms: number | undefined) {
  if (!ms) return { signal: outer, expired: () => false, restart() {}, clear() {} };
  const ctl = new AbortController();
  let expired = false;
  let timer: NodeJS.Timeout | undefined;
  const restart = () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      expired = true;
      ctl.abort(new ConnectError("deadline exceeded", Code.DeadlineExceeded));
    }, ms);
  };
  const onAbort = () => ctl.abort(outer?.reason);
  if (outer?.aborted) onAbort();
  else outer?.addEventListener("abort", onAbort, { once: true });
  restart();
  return {
    signal: ctl.signal,
    expired: () => expired,
    restart,
    clear() {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onAbort);
    },
  };
}

/** Connect's session manager closed the connection because a keepalive ping went unanswered. */
function pingUnanswered(err: unknown): boolean {
  for (let e = err, depth = 0; e instanceof Error && depth < 8; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof ConnectError && e.rawMessage === "PING timed out") return true;
  }
  return false;
}

/** "2 s", "0.5 s", "30 s". */
const seconds = (ms: number) => `${Number((ms / 1000).toFixed(3))} s`;

/** How a connected stage reaches its remote model: its calls, and how their failures read and are logged. */
class RemoteModel {
  readonly client: InferenceClient;
  /** "remote model NAME at LABEL": how errors name the remote. */
  private readonly where: string;
  private readonly label: string;
  private readonly logged: { model: string; endpoint?: string };
  /** Whether requests are failing for want of the remote: the log hears when this changes, not each request. */
  private failing = false;

  constructor(
    transport: Transport,
    readonly name: string,
    readonly version: string,
    private readonly options: ConnectStageOptions,
  ) {
    this.client = createClient(GRPCInferenceService, transport);
    this.label = options.remoteLabel ?? "";
    this.where = this.label ? `remote model ${name} at ${this.label}` : `remote model ${name}`;
    this.logged = { model: name, ...(options.endpoint ? { endpoint: options.endpoint } : {}) };
  }

  /** Runs a unary call, re-raising its failure as the remote model's. */
  async call<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (err) {
      throw remoteError(err, this.name, this.label);
    }
  }

  /** The remote answered: the log hears it if requests were failing. */
  answered(): void {
    if (!this.failing) return;
    this.failing = false;
    this.options.logger?.info(this.logged, "remote model answering again");
  }

  private unreachable(err: StageError, detail: unknown): void {
    if (this.failing) return;
    this.failing = true;
    this.options.logger?.warn(
      { ...this.logged, error: err.rawMessage, detail: describeTransportError(detail) },
      "remote model failing",
    );
  }

  /** Why a call failed, as its caller should see it. */
  failure(err: unknown, outer: AbortSignal | undefined, expired: boolean): StageError {
    const { name, where } = this;
    if (expired) {
      const e = new StageError(
        Code.DeadlineExceeded,
        name,
        `${where}: no answer within ${seconds(this.options.timeoutMs ?? 0)}`,
        { cause: err },
      );
      this.unreachable(e, err);
      return e;
    }
    // The caller's own cancellation or deadline: the caller reports it.
    if (outer?.aborted) return remoteError(err, name, this.label);
    const ce = ConnectError.from(err);
    if (sentByServer(ce)) {
      // Its server is up but does not have the model (yet: it is starting, or reloading): not ours to call unknown.
      if (ce.code === Code.NotFound) {
        const e = new StageError(Code.Unavailable, name, `${where} is not available on its server: ${ce.rawMessage}`, {
          cause: err,
        });
        this.unreachable(e, err);
        return e;
      }
      this.answered();
      return remoteError(err, name, this.label);
    }
    const e = this.transportFailure(err);
    this.unreachable(e, err);
    return e;
  }

  /** A call that failed in transport (no status from the remote's server), named by how. */
  private transportFailure(err: unknown): StageError {
    const { name, where } = this;
    const redact = this.options.redactTransportErrors;
    const detail = redact ? "" : `: ${describeTransportError(err)}`;
    if (refusedBeforeProcessing(err)) {
      const sent = refusedAttemptCount(err);
      return new StageError(
        Code.Unavailable,
        name,
        `${where}: refused by its server before processing (not run; sent ${sent} time${sent === 1 ? "" : "s"})${detail}`,
        { cause: err },
      );
    }
    if (neverSent(err)) return new StageError(Code.Unavailable, name, `${where}: unreachable${detail}`, { cause: err });
    if (pingUnanswered(err)) {
      return new StageError(
        Code.Unavailable,
        name,
        `${where}: connection closed, its keepalive ping went unanswered (not resent: the request may have reached the server)`,
        { cause: err },
      );
    }
    if (isConnectionLost(err)) {
      // A dropped connection is the remote going away, not our caller cancelling.
      return new StageError(
        Code.Unavailable,
        name,
        `${where}: connection lost with the request in flight (not resent: it may have reached the server)${detail}`,
        { cause: err },
      );
    }
    if (redact) return new StageError(Code.Unavailable, name, `${where}: unreachable or not answering`, { cause: err });
    return remoteError(err, name, this.label);
  }

  /** isReady for the stage: the cached state (its first check made here), or a ModelReady call each time. */
  async readiness(): Promise<() => boolean | Promise<boolean>> {
    const { client, name, version, logged } = this;
    const { cachedReadiness: cached, timeoutMs, logger } = this.options;
    if (!cached) {
      return async () => {
        try {
          return (await client.modelReady({ name, version })).ready;
        } catch {
          return false;
        }
      };
    }
    const checkMs = cached.timeoutMs ?? Math.min(5000, timeoutMs || 5000);
    let known = false;
    const readiness = new ReadinessCache(
      async (ms) => (await client.modelReady({ name, version }, { timeoutMs: ms })).ready,
      cached.refreshMs ?? 1000,
      checkMs,
      (ready, why) => {
        if (!known) return;
        if (ready) logger?.info(logged, "remote model ready again");
        else
          logger?.warn(
            { ...logged, ...(why ? { detail: describeTransportError(why) } : {}) },
            "remote model not ready",
          );
      },
    );
    await readiness.refresh();
    known = true;
    return () => readiness.get();
  }

  /** A ModelInfer call under the request's deadline. */
  async infer(request: InferRequest, opts?: InferOptions): Promise<InferResponse> {
    const deadline = callDeadline(opts?.signal, this.options.timeoutMs);
    let res: Awaited<ReturnType<InferenceClient["modelInfer"]>>;
    try {
      // A traced request asks the remote (another Trellis server) to trace its part and send it back.
      const headers = opts?.trace?.remoteHeaders?.();
      res = await this.client.modelInfer(inferRequestToWire(request, this.name, this.version), {
        signal: deadline.signal,
        ...(headers ? { headers } : {}),
      });
    } catch (err) {
      throw this.failure(err, opts?.signal, deadline.expired());
    } finally {
      deadline.clear();
    }
    this.answered();
    const reply = res.parameters[TRACE_REPLY_PARAMETER];
    if (reply) {
      // The remote's own trace goes into the caller's, not on to the caller's client.
      delete res.parameters[TRACE_REPLY_PARAMETER];
      if (reply.parameterChoice.case === "stringParam") opts?.trace?.remote?.(reply.parameterChoice.value);
    }
    return inferResponseFromWire(res, this.name);
  }

  /**
   * A decoupled model's responses over ModelStreamInfer: the request alone on a stream of its
   * own, half-closed at once, so the stream ends with the model's last response.
   */
  async *inferStream(request: InferRequest, opts?: InferOptions): AsyncGenerator<InferResponse> {
    const wire = inferRequestToWire(request, this.name, this.version);
    async function* alone() {
      yield wire;
    }
    // The deadline is each response's: a stream may run long, but not go silent that long.
    const deadline = callDeadline(opts?.signal, this.options.timeoutMs);
    let modelError: ConnectError | undefined;
    try {
      const answers: AsyncIterable<ModelStreamInferResponse> = this.client.modelStreamInfer(alone(), {
        signal: deadline.signal,
      });
      for await (const answer of answers) {
        deadline.restart();
        // A stream answer's error carries no code (KServe v2 sends only its message).
        if (answer.errorMessage) {
          modelError = new ConnectError(answer.errorMessage, Code.Unknown);
          throw modelError;
        }
        if (answer.inferResponse) yield inferResponseFromWire(answer.inferResponse, this.name);
      }
      this.answered();
    } catch (err) {
      // The model's own error, sent in a stream answer.
      if (err === modelError) throw remoteError(err, this.name, this.label);
      throw this.failure(err, opts?.signal, deadline.expired());
    } finally {
      deadline.clear();
    }
  }

  async statistics(): Promise<ModelStatistics> {
    const { client, name, version } = this;
    const res = await this.call(() => client.modelStatistics({ name, version }));
    const stats = res.modelStats[0];
    if (!stats) throw new StageError(Code.NotFound, name, `remote model ${name} reported no statistics`);
    return stats;
  }
}

/**
 * Reads the remote model's config and metadata, then returns a Stage whose
 * infer() is a ModelInfer call (and, for a decoupled model, whose inferStream()
 * is a ModelStreamInfer stream). Tensors travel as raw_* contents.
 */
export async function connectStage(
  transport: Transport,
  name: string,
  options: ConnectStageOptions = {},
): Promise<Stage> {
  const version = options.version ?? "";
  const remote = new RemoteModel(transport, name, version, options);
  const { client } = remote;
  // Bounded by the request deadline too: a load must not hang on a remote that does not answer.
  const bounded = options.timeoutMs ? { timeoutMs: options.timeoutMs } : {};
  const configResponse = await remote.call(() => client.modelConfig({ name, version }, bounded));
  const config: ModelConfig | undefined = configResponse.config;
  if (!config) throw new StageError(Code.Internal, name, `remote model ${name} returned no config`);
  const metadata: StageMetadata = metadataFromWire(
    await remote.call(() => client.modelMetadata({ name, version }, bounded)),
  );
  const servedVersion = version || metadata.versions.at(-1) || "1";
  const isReady = await remote.readiness();

  const stage: Stage = {
    name,
    version: servedVersion,
    config,
    isReady,
    metadata: () => metadata,
    infer: (request: InferRequest, opts?: InferOptions) => remote.infer(request, opts),
    statistics: () => remote.statistics(),
    close: async () => {},
  };
  if (isDecoupled(config)) {
    stage.inferStream = (request: InferRequest, opts?: InferOptions) => remote.inferStream(request, opts);
  }
  return stage;
}
