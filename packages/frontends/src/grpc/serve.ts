/**
 * serveStage: any Stage (or a registry of them) as a KServe v2
 * GRPCInferenceService and grpc.health.v1.Health over Connect, so gRPC,
 * gRPC-Web and Connect clients all reach it from one handler; and the HTTP/2
 * server for it (createGrpcServer, listenStage). The services are in
 * service.ts, ModelInfer's wire in infer.ts.
 */
import http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { type ConnectRouter, createRouterTransport, type Transport } from "@connectrpc/connect";
import type { Compression } from "@connectrpc/connect/protocol";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import { type ModelRegistry, stageRegistry } from "@trellis/kserve";
import {
  type DecompressionBudget,
  HTTP2_SETTINGS,
  holdDecompressedUntilClose,
  namingInputLimit,
  requestCompression,
  widenSessionWindow,
} from "@trellis/kserve/wire";
import { GRPCInferenceService, Health } from "@trellis/protocol";
import { Code, type Stage } from "@trellis/stage";
import { forwardedHeaders } from "../header-forwarding.js";
import { loggingWithheld } from "../infer.js";
import { type ApiRestrictions, restrictionError, restrictionInterceptor } from "../restrictions.js";
import { closeOnResetDrift, GRPC_SESSION_MEMORY_MB, ignoreIdleStreamFrames } from "./http2-resets.js";
import { handleModelInfer } from "./infer.js";
import { guardRepositoryLoad, type LoadGuardOptions } from "./load-guard.js";
import { grpcModelInferHandler, MODEL_INFER_PATH, withReadableGrpcMessage } from "./model-infer.js";
import { type ResponseCompressionLevel, responseAlgorithm } from "./response-compression.js";
import { healthService, inferenceService, type ServeOptions } from "./service.js";
import { DEFAULT_MAX_UNREAD_ANSWER_BYTES, UnreadAnswers } from "./unread-answers.js";

function asRegistry(x: Stage | ModelRegistry): ModelRegistry {
  return typeof (x as ModelRegistry).resolve === "function" ? (x as ModelRegistry) : stageRegistry(x as Stage);
}

/**
 * Connect routes serving `target` (one Stage or a registry) as KServe v2
 * gRPC plus health. Pass to connectNodeAdapter or createRouterTransport.
 */
export function serveStage(target: Stage | ModelRegistry, options: ServeOptions = {}) {
  const registry = asRegistry(target);
  return (router: ConnectRouter) => {
    router.service(GRPCInferenceService, inferenceService(registry, options));
    router.service(Health, healthService(registry));
  };
}

/** An in-process transport to a stage or registry: no sockets, same code path as a remote call. */
export function inMemoryTransport(target: Stage | ModelRegistry): Transport {
  return createRouterTransport(serveStage(target));
}

/**
 * Handler options for tensor traffic: requests compressed with gzip, deflate
 * (gRPC's two codings, both of which Triton takes) or br are accepted, each
 * inflated only up to the handler's readMaxBytes (a larger one is refused
 * RESOURCE_EXHAUSTED naming the limit and `maxInputFlag`, the setting that
 * raises it), but responses are never compressed. Tensors barely compress and
 * gzip on a megabyte response costs more than sending it over loopback or a
 * datacenter link (Triton does not compress by default either).
 */
export function serverCompression(
  maxInputFlag?: string,
  budget?: DecompressionBudget,
): {
  acceptCompression: Compression[];
  compressMinBytes: number;
} {
  return { acceptCompression: requestCompression(maxInputFlag, budget), compressMinBytes: Number.POSITIVE_INFINITY };
}

/** serverCompression() with refusals that name no setting. */
export const SERVER_COMPRESSION = serverCompression();

const INFER_PATHS = new Set([MODEL_INFER_PATH, "/inference.GRPCInferenceService/ModelStreamInfer"]);

/**
 * The largest gRPC request message accepted unless told otherwise: 64 MiB, the
 * default of Triton's --http-max-input-size, and so the same cap on both ports.
 * Triton's gRPC frontend takes up to INT32_MAX (2^31 - 1) bytes, a cap that
 * holds for compressed messages only once inflated: a 1 MB gzip message then
 * grew a server by over 2 GB and stalled it for seconds. A larger message
 * needs the cap raised (maxInputBytes, the server's --grpc-max-input-size).
 */
export const DEFAULT_GRPC_MAX_INPUT_BYTES = 64 * 1024 * 1024;

export interface GrpcServerOptions extends ServeOptions {
  /**
   * Largest request message accepted (default DEFAULT_GRPC_MAX_INPUT_BYTES), compressed
   * ones once inflated; a larger one is refused with RESOURCE_EXHAUSTED as soon as its
   * envelope's length prefix arrives (or, compressed, as soon as inflating passes it).
   */
  maxInputBytes?: number;
  /** The setting that raises maxInputBytes (e.g. "--grpc-max-input-size"), named in those refusals. */
  maxInputFlag?: string;
  /**
   * Bytes of decompressed messages held at once across all calls (shared with other listeners
   * when given one); each call's share is given back when it is answered. Without it, only
   * maxInputBytes bounds each message.
   */
  decompressionBudget?: DecompressionBudget;
  /** Serve over TLS (h2) instead of cleartext HTTP/2. */
  tls?: GrpcServerTlsOptions;
  /** Endpoint groups that require a header (tritonserver's --grpc-restricted-protocol). */
  restrictions?: ApiRestrictions;
  /**
   * Compress ModelInfer and ModelStreamInfer responses (tritonserver's
   * --grpc-infer-response-compression-level; default none), with the algorithm gRPC
   * core picks for the level among those the client accepts.
   */
  responseCompression?: ResponseCompressionLevel;
  /**
   * Bytes of answers written and not yet taken by their clients, across all connections
   * (default DEFAULT_MAX_UNREAD_ANSWER_BYTES); past it connections that leave answers unread
   * are reset (GOAWAY ENHANCE_YOUR_CALM), never one reading at a pace that clears its own
   * (see unread-answers.ts).
   */
  maxUnreadAnswerBytes?: number;
}

export interface GrpcServerTlsOptions {
  /** The server's certificate chain and private key (PEM). */
  cert: string | Buffer;
  key: string | Buffer;
  /** CA certificate(s) client certificates must chain to (mutual TLS). */
  ca?: string | Buffer;
  /** Refuse clients without a certificate that chains to `ca` (mutual TLS). Default false. */
  requireClientCert?: boolean;
}

export interface ListenOptions extends GrpcServerOptions {
  /** Interface to bind (default 127.0.0.1). */
  host?: string;
  /** Port to bind (default 0: an ephemeral port). */
  port?: number;
}

export interface ListeningServer {
  /** The bound port (useful with port 0). */
  port: number;
  host: string;
  /** Base URL for createGrpcTransport: http://, or https:// with TLS. */
  url: string;
  server: http2.Http2Server | http2.Http2SecureServer;
  /** Stops accepting and closes open sessions. */
  close(): Promise<void>;
}

export interface GrpcServer {
  server: http2.Http2Server | http2.Http2SecureServer;
  /** The HTTP/2 sessions open right now (for GOAWAY at shutdown). */
  sessions: ReadonlySet<http2.ServerHttp2Session>;
  /** The bound on unread answers across those sessions. */
  unreadAnswers: UnreadAnswers;
}

/**
 * An HTTP/2 server for `target` (gRPC, gRPC-Web and Connect, as serveStage;
 * cleartext, or TLS with `tls`), set up for tensor traffic: wide flow-control windows,
 * uncompressed responses, requests over `maxInputBytes` refused with
 * RESOURCE_EXHAUSTED. Unary ModelInfer over gRPC takes a direct path
 * (see grpc-model-infer.ts); everything else goes through Connect.
 */
export function createGrpcServer(
  target: Stage | ModelRegistry,
  {
    maxInputBytes = DEFAULT_GRPC_MAX_INPUT_BYTES,
    maxInputFlag,
    decompressionBudget,
    tls,
    restrictions,
    responseCompression = "none",
    maxUnreadAnswerBytes = DEFAULT_MAX_UNREAD_ANSWER_BYTES,
    ...options
  }: GrpcServerOptions = {},
): GrpcServer {
  const registry = asRegistry(target);
  const adapter = (compressMinBytes: number) =>
    connectNodeAdapter({
      routes: serveStage(registry, options),
      readMaxBytes: maxInputBytes,
      interceptors: restrictions ? [restrictionInterceptor(restrictions)] : [],
      ...serverCompression(maxInputFlag, decompressionBudget),
      compressMinBytes,
    });
  const connect = adapter(SERVER_COMPRESSION.compressMinBytes);
  // Inference responses through Connect (streams, compressed requests) compress at the level
  // set, the rest never: a second handler, told which algorithm to answer with.
  const connectInfer = responseCompression === "none" ? connect : adapter(0);
  const withheld = loggingWithheld(options.logger);
  const modelInfer = grpcModelInferHandler(
    (msg, signal, call) =>
      handleModelInfer(registry, msg, signal, {
        tracing: options.tracing,
        sharedMemory: options.sharedMemory,
        bytesInFlight: options.bytesInFlight,
        call,
        forwarded: options.forwardHeaders && forwardedHeaders(options.forwardHeaders, call.headers()),
        withheld,
      }),
    {
      readMaxBytes: maxInputBytes,
      refuse:
        restrictions &&
        ((headers) => restrictionError(restrictions, "inference", (h) => headers[h] as string | undefined, "grpc")),
      compression: responseCompression,
      maxInputFlag,
    },
  );
  const loadLimits = registry.repository?.loadLimits;
  const loadGuard: LoadGuardOptions | undefined = loadLimits && {
    limits: loadLimits,
    maxBytes: maxInputBytes,
    budget: decompressionBudget,
    refuse: restrictions
      ? (headers) => restrictionError(restrictions, "model-repository", (h) => headers[h] as string | undefined, "grpc")
      : undefined,
  };
  // What Connect inflates for a call stays reserved in the budget until the call is answered.
  const connectCall = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) =>
    decompressionBudget ? holdDecompressedUntilClose(res, () => viaConnect(req, res)) : viaConnect(req, res);
  const handle = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    if (modelInfer(req, res)) return;
    // A model load's parameters are counted before Connect decodes them (see grpc-load-guard.ts).
    if (loadGuard && guardRepositoryLoad(req, res, loadGuard, () => connectCall(req, res))) return;
    connectCall(req, res);
  };
  const viaConnect = (req: http2.Http2ServerRequest, res: http2.Http2ServerResponse) => {
    // Connect writes its status trailers through addTrailers; grpc-js clients need grpc-message
    // encoded as the gRPC spec does (see encodeGrpcMessage), and its refusals of a message over
    // the cap name the setting that raises it.
    const addTrailers = res.addTrailers.bind(res);
    res.addTrailers = (trailers) => addTrailers(withReadableGrpcMessage(namingLimit(trailers, maxInputFlag)));
    if (connectInfer !== connect && INFER_PATHS.has(req.url)) {
      // Connect answers with the first encoding the client accepts: accept only gRPC core's pick.
      const accept = req.headers["grpc-accept-encoding"];
      req.headers["grpc-accept-encoding"] =
        responseAlgorithm(responseCompression, Array.isArray(accept) ? accept.join(",") : accept) ?? "identity";
      connectInfer(req, res);
      return;
    }
    connect(req, res);
  };
  const server = tls
    ? http2.createSecureServer(
        {
          settings: HTTP2_SETTINGS,
          maxSessionMemory: GRPC_SESSION_MEMORY_MB,
          cert: tls.cert,
          key: tls.key,
          ca: tls.ca,
          requestCert: tls.requireClientCert ?? false,
          rejectUnauthorized: tls.requireClientCert ?? false,
        },
        handle,
      )
    : http2.createServer({ settings: HTTP2_SETTINGS, maxSessionMemory: GRPC_SESSION_MEMORY_MB }, handle);
  // A client resetting its own calls must not break the connection its other calls share (see http2-resets.ts).
  ignoreIdleStreamFrames(server, !!tls);
  const sessions = new Set<http2.ServerHttp2Session>();
  const unreadAnswers = new UnreadAnswers(maxUnreadAnswerBytes, (held, total) =>
    options.logger?.warn(
      { heldBytes: held, totalBytes: total, limitBytes: maxUnreadAnswerBytes },
      "gRPC connection reset: its unread answers put the total over --grpc-max-unread-answer-bytes",
    ),
  );
  server.on("session", (s) => {
    widenSessionWindow(s);
    closeOnResetDrift(s);
    unreadAnswers.watch(s);
    sessions.add(s);
    s.on("close", () => sessions.delete(s));
  });
  return { server, sessions, unreadAnswers };
}

/** `trailers` with Connect's refusal of a message over readMaxBytes reworded by namingInputLimit. */
function namingLimit(trailers: http2.OutgoingHttpHeaders, flag: string | undefined): http2.OutgoingHttpHeaders {
  const message = trailers["grpc-message"];
  if (String(trailers["grpc-status"]) !== String(Code.ResourceExhausted) || typeof message !== "string")
    return trailers;
  let text: string;
  try {
    text = decodeURIComponent(message);
  } catch {
    return trailers;
  }
  const named = namingInputLimit(text, flag);
  return named === text ? trailers : { ...trailers, "grpc-message": encodeURIComponent(named) };
}

/** Serves `target` over HTTP/2 (gRPC's transport; TLS with `tls`) on host:port (0 = ephemeral). */
export async function listenStage(
  target: Stage | ModelRegistry,
  { host = "127.0.0.1", port = 0, ...options }: ListenOptions = {},
): Promise<ListeningServer> {
  const { server, sessions } = createGrpcServer(target, options);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => resolve());
  });
  const bound = (server.address() as AddressInfo).port;
  return {
    port: bound,
    host,
    url: `${options.tls ? "https" : "http"}://${host.includes(":") ? `[${host}]` : host}:${bound}`,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const s of sessions) s.close();
      }),
  };
}
