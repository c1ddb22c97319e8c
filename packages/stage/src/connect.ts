/**
 * connectStage: a Stage backed by any KServe v2 gRPC endpoint (a Trellis
 * stage service or a real Triton), used exactly like a local one.
 */

import type http2 from "node:http2";
import { type Client, ConnectError, createClient, createRouterTransport, type Transport } from "@connectrpc/connect";
import { createGrpcTransport, Http2SessionManager } from "@connectrpc/connect-node";
import { GRPCInferenceService, type ModelConfig, type ModelStreamInferResponse } from "@trellis/protocol";
import { Code, StageError } from "./errors.js";
import type { ModelRegistry } from "./registry.js";
import { HTTP2_SETTINGS, serveStage, widenSessionWindow } from "./serve.js";
import {
  type InferOptions,
  type InferRequest,
  type InferResponse,
  isDecoupled,
  type Stage,
  type StageMetadata,
} from "./stage.js";
import { describeTransportError, isConnectionLost } from "./transport-errors.js";
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

/** Connect's session manager, widening each new connection's receive window for large tensors. */
class WideWindowSessionManager extends Http2SessionManager {
  private readonly widened = new WeakSet<http2.Http2Session>();

  override async request(
    ...args: Parameters<Http2SessionManager["request"]>
  ): ReturnType<Http2SessionManager["request"]> {
    const stream = await super.request(...args);
    const session = stream.session;
    if (session && !this.widened.has(session)) {
      this.widened.add(session);
      widenSessionWindow(session);
    }
    return stream;
  }
}

/** A transport that owns its HTTP/2 connection: close() ends it (and any call still on it). */
export interface ClosableTransport extends Transport {
  close(): void;
}

/** A gRPC transport (HTTP/2) to a KServe v2 endpoint such as "http://127.0.0.1:8001" (or https:// with `tls`). */
export function grpcTransport(
  baseUrl: string,
  options: { headers?: Record<string, string>; tls?: GrpcTlsOptions; connectTimeoutMs?: number } = {},
): ClosableTransport {
  const headers = options.headers;
  const sessionManager = new WideWindowSessionManager(
    baseUrl,
    options.connectTimeoutMs !== undefined ? { connectTimeoutMs: options.connectTimeoutMs } : {},
    { settings: HTTP2_SETTINGS, ...options.tls },
  );
  const transport = createGrpcTransport({
    baseUrl,
    sessionManager,
    // Tensors barely compress; asking for gzip only costs CPU on both ends.
    acceptCompression: [],
    interceptors: headers
      ? [
          (next) => (req) => {
            for (const [k, v] of Object.entries(headers)) req.header.set(k, v);
            return next(req);
          },
        ]
      : [],
  });
  // Without this an unloaded remote step keeps its idle connection open for Connect's 15-minute idle timeout.
  return Object.assign(transport, { close: () => sessionManager.abort() });
}

/** An in-process transport to a stage or registry: no sockets, same code path as a remote call. */
export function inMemoryTransport(target: Stage | ModelRegistry): Transport {
  return createRouterTransport(serveStage(target));
}

export interface ConnectStageOptions {
  /** Version to address; "" lets the server choose. */
  version?: string;
  /** Label used in errors, e.g. the endpoint URL. */
  remoteLabel?: string;
  /** Per-request deadline in milliseconds. */
  timeoutMs?: number;
}

/** Re-raises a remote error with its code, saying which remote model raised it. */
export function remoteError(err: unknown, model: string, remoteLabel: string): StageError {
  const ce = ConnectError.from(err);
  const where = remoteLabel ? `remote model ${model} at ${remoteLabel}` : `remote model ${model}`;
  return new StageError(ce.code, model, `${where}: ${ce.rawMessage}`, { cause: err });
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
  const client: InferenceClient = createClient(GRPCInferenceService, transport);
  const version = options.version ?? "";
  const label = options.remoteLabel ?? "";
  const call = async <T>(fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (err) {
      throw remoteError(err, name, label);
    }
  };
  const configResponse = await call(() => client.modelConfig({ name, version }));
  const config: ModelConfig | undefined = configResponse.config;
  if (!config) throw new StageError(Code.Internal, name, `remote model ${name} returned no config`);
  const metadata: StageMetadata = metadataFromWire(await call(() => client.modelMetadata({ name, version })));
  const servedVersion = version || metadata.versions.at(-1) || "1";
  const stage: Stage = {
    name,
    version: servedVersion,
    config,
    isReady: async () => {
      try {
        return (await client.modelReady({ name, version })).ready;
      } catch {
        return false;
      }
    },
    metadata: () => metadata,
    async infer(request: InferRequest, opts?: InferOptions): Promise<InferResponse> {
      let res: Awaited<ReturnType<InferenceClient["modelInfer"]>>;
      try {
        res = await client.modelInfer(inferRequestToWire(request, name, version), {
          signal: opts?.signal,
          timeoutMs: options.timeoutMs,
        });
      } catch (err) {
        // A dropped connection is the remote going away, not our caller cancelling.
        if (!opts?.signal?.aborted && isConnectionLost(err)) {
          const where = label ? `remote model ${name} at ${label}` : `remote model ${name}`;
          throw new StageError(
            Code.Unavailable,
            name,
            `${where}: connection lost with the request in flight (not resent: it may have reached the server): ${describeTransportError(err)}`,
            { cause: err },
          );
        }
        throw remoteError(err, name, label);
      }
      return inferResponseFromWire(res, name);
    },
    statistics: async () => {
      const res = await call(() => client.modelStatistics({ name, version }));
      const stats = res.modelStats[0];
      if (!stats) throw new StageError(Code.NotFound, name, `remote model ${name} reported no statistics`);
      return stats;
    },
    close: async () => {},
  };
  if (isDecoupled(config)) {
    // A decoupled model's responses come over ModelStreamInfer: the request alone on a stream of
    // its own, half-closed at once, so the stream ends with the model's last response.
    stage.inferStream = async function* (request: InferRequest, opts?: InferOptions) {
      const wire = inferRequestToWire(request, name, version);
      async function* alone() {
        yield wire;
      }
      try {
        const answers: AsyncIterable<ModelStreamInferResponse> = client.modelStreamInfer(alone(), {
          signal: opts?.signal,
          timeoutMs: options.timeoutMs,
        });
        for await (const answer of answers) {
          // A stream answer's error carries no code (KServe v2 sends only its message).
          if (answer.errorMessage) throw new ConnectError(answer.errorMessage, Code.Unknown);
          if (answer.inferResponse) yield inferResponseFromWire(answer.inferResponse, name);
        }
      } catch (err) {
        throw remoteError(err, name, label);
      }
    };
  }
  return stage;
}
