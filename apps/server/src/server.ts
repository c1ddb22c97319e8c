/**
 * The three listeners of a Triton-style server over one RepositoryManager:
 * gRPC (HTTP/2, Connect's adapter: gRPC, gRPC-Web, Connect), HTTP/REST
 * (HTTP/1.1, the REST API plus the same Connect routes for gRPC-Web and
 * Connect clients) and Prometheus metrics. Also graceful shutdown.
 */
import http from "node:http";
import type http2 from "node:http2";
import net, { type AddressInfo } from "node:net";
import { connectNodeAdapter } from "@connectrpc/connect-node";
import {
  type ApiRestrictions,
  BytesInFlight,
  createGrpcServer,
  DEFAULT_HTTP_MAX_INPUT_BYTES,
  DEFAULT_MAX_INFLIGHT_BYTES_TENSOR_BYTES,
  type GrpcConnectionOptions,
  type GrpcServerTlsOptions,
  type LogSettingsControl,
  manageGrpcConnection,
  type ResponseCompressionLevel,
  type RestContext,
  restHandler,
  restrictionInterceptor,
  serverCompression,
  serveStage,
  TRITON_EXTENSIONS,
  type TraceControl,
} from "@trellis/frontends";
// The cloud endpoints' modules are imported only when their listener is asked for (below).
import type { SageMakerOptions, VertexAiOptions } from "@trellis/frontends/cloud";
import {
  DEFAULT_DECOMPRESSION_BUDGET_BYTES,
  DecompressionBudget,
  holdDecompressedUntilClose,
  type SystemSharedMemory,
} from "@trellis/kserve/wire";
import type { RepositoryManager } from "@trellis/model-repository";
import { answerParseError } from "./http-parse-errors.js";
import { createMetrics, type MetricsOptions } from "./observability/metrics.js";
import { traceRoutes } from "./observability/trace-routes.js";
import type { TraceKeeping } from "./observability/tracing.js";
import { readUiAssets, uiHandler } from "./web-page.js";

// Only mounted on the HTTP/1.1 server, so requests are always IncomingMessage.
type NodeHandlerFn = NonNullable<Parameters<typeof connectNodeAdapter>[0]["fallback"]>;

/**
 * The name server metadata reports by default: Triton's own (its --id default), since Triton's
 * example clients (simple_http_health_metadata, simple_grpc_health_metadata) check for it.
 */
export const SERVER_NAME = "triton";
export const SERVER_VERSION = "0.1.0";
/** The server metadata's extensions: Triton's list, whatever is switched on (see TRITON_EXTENSIONS). */
export const EXTENSIONS: readonly string[] = TRITON_EXTENSIONS;

export interface Logger {
  info(obj: object | string, msg?: string): void;
  warn(obj: object | string, msg?: string): void;
  error(obj: object | string, msg?: string): void;
  debug(obj: object | string, msg?: string): void;
}

export interface ServerOptions {
  host?: string;
  httpPort?: number;
  grpcPort?: number;
  metricsPort?: number;
  /** Largest HTTP/REST request body accepted (Triton's --http-max-input-size); default 64 MiB. */
  httpMaxInputBytes?: number;
  /** Largest infer answer compressed on Accept-Encoding (--http-max-compressed-answer-size); default 4 MiB. */
  httpMaxCompressedAnswerBytes?: number;
  /**
   * Largest gRPC request message accepted on the gRPC port, compressed ones once inflated; default 64 MiB
   * (DEFAULT_GRPC_MAX_INPUT_BYTES: Triton's gRPC cap, 2^31 - 1, let a 1 MB gzip message inflate to gigabytes).
   */
  grpcMaxInputBytes?: number;
  /**
   * Bytes of decompressed request messages and bodies held at once, across all requests on every
   * port (--max-inflight-decompressed-bytes); default DEFAULT_DECOMPRESSION_BUDGET_BYTES.
   */
  maxInflightDecompressedBytes?: number;
  /** Bytes of gRPC answers clients have not read, across connections (--grpc-max-unread-answer-bytes). */
  grpcMaxUnreadAnswerBytes?: number;
  /**
   * Bytes BYTES tensors may hold while their requests are in flight, counted as payload plus
   * BYTES_ELEMENT_OVERHEAD an element, across every port (--max-inflight-bytes-tensor-bytes);
   * default DEFAULT_MAX_INFLIGHT_BYTES_TENSOR_BYTES.
   */
  maxInflightBytesTensorBytes?: number;
  logger: Logger;
  /** The logging extension's settings (GET/POST /v2/logging, gRPC LogSettings); without it they answer UNIMPLEMENTED. */
  logSettings?: LogSettingsControl;
  /** System shared memory regions clients may register (tritonserver's --allow-client-shm); without it, none. */
  sharedMemory?: SystemSharedMemory;
  /** Which latency metrics to publish (tritonserver's --metrics-config). */
  metrics?: MetricsOptions;
  /** Request tracing (the trace extension, --trace-config); without it tracing stays OFF. */
  tracing?: TraceControl & { flush(): Promise<void>; keeping?: TraceKeeping };
  /** Serve gRPC over TLS (tritonserver's --grpc-use-ssl); HTTP and metrics stay cleartext, as in Triton. */
  grpcTls?: GrpcServerTlsOptions;
  /** Endpoint groups that require a header: tritonserver's --http-restricted-api and --grpc-restricted-protocol. */
  httpRestrictions?: ApiRestrictions;
  grpcRestrictions?: ApiRestrictions;
  /** Per-listener bind addresses (tritonserver's --http-address / --grpc-address / --metrics-address); default `host`. */
  addresses?: { http?: string; grpc?: string; metrics?: string };
  /** Which listeners to open (tritonserver's --allow-http / --allow-grpc / --allow-metrics); each default true. */
  allow?: { http?: boolean; grpc?: boolean; metrics?: boolean };
  /** The server's name in server metadata (tritonserver's --id); default "triton" (SERVER_NAME). */
  serverName?: string;
  /** The version server metadata reports (--server-version); default SERVER_VERSION. */
  serverVersion?: string;
  /** Headers forwarded as request parameters (tritonserver's --http-header-forward-pattern / --grpc-header-forward-pattern). */
  forwardHeaders?: { http?: RegExp; grpc?: RegExp };
  /** Triton's SageMaker endpoint (--allow-sagemaker): its port and model; without it, none. */
  sagemaker?: { port: number; options: SageMakerOptions };
  /** Triton's Vertex AI endpoint (--allow-vertex-ai): its port, routes and model; without it, none. */
  vertexAi?: { port: number; options: Omit<VertexAiOptions, "metrics"> };
  /** Compression of gRPC inference responses (tritonserver's --grpc-infer-response-compression-level); default none. */
  grpcResponseCompression?: ResponseCompressionLevel;
  /** Keepalive pings and maximum connection age on the gRPC port (tritonserver's --grpc-keepalive-* and --grpc-max-connection-age*). */
  grpcConnections?: GrpcConnectionOptions;
  /** How long HTTP/1.1 clients (REST, SageMaker, Vertex AI, metrics) may take; see HttpTimeouts. */
  httpTimeouts?: HttpTimeouts;
  /** The page on the HTTP port (/ui, `--ui`); default on, always off when the HTTP API is restricted. */
  ui?: boolean;
  /** The repositories served (--model-repository): the page links the last model analysis found at one's root. */
  repositories?: readonly string[];
}

/** Limits on slow or silent HTTP/1.1 clients, in milliseconds; 0: no limit. */
export interface HttpTimeouts {
  /** A request's headers must have arrived this long after it began (--http-headers-timeout; default 60 s). */
  headersMs?: number;
  /** A whole request, body included, must have arrived this long after it began (--http-request-timeout; default 120 s). */
  requestMs?: number;
  /** How long a keep-alive connection may wait for its next request (--http-keepalive-timeout; default 5 s). */
  keepAliveMs?: number;
}

export const DEFAULT_HTTP_HEADERS_TIMEOUT_MS = 60_000;
/** Room for a 64 MiB body (the default --http-max-input-size) at about 0.5 MB/s. */
export const DEFAULT_HTTP_REQUEST_TIMEOUT_MS = 120_000;
export const DEFAULT_HTTP_KEEPALIVE_TIMEOUT_MS = 5_000;

/**
 * At shutdown, how long a keep-alive HTTP connection with no request in flight is kept open: a
 * request its client sent just as shutdown began is on the wire, and is answered (with
 * `Connection: close`) instead of meeting a reset.
 */
const SHUTDOWN_IDLE_GRACE_MS = 1_000;

/**
 * An HTTP/1.1 server with `timeouts`; with a `budget`, what a request decompresses stays
 * reserved in it until the request is answered.
 */
function httpServerWith(
  timeouts: HttpTimeouts,
  listener: http.RequestListener,
  budget?: DecompressionBudget,
): http.Server {
  const handler: http.RequestListener = budget
    ? (req, res) => holdDecompressedUntilClose(res, () => listener(req, res))
    : listener;
  const headersTimeout = timeouts.headersMs ?? DEFAULT_HTTP_HEADERS_TIMEOUT_MS;
  const requestTimeout = timeouts.requestMs ?? DEFAULT_HTTP_REQUEST_TIMEOUT_MS;
  const shortest = Math.min(...[headersTimeout, requestTimeout].filter((ms) => ms > 0), 300_000);
  const server = http.createServer(
    // A timeout fires up to one check interval late: a tenth of the shortest, within [0.1 s, 30 s].
    { headersTimeout, requestTimeout, connectionsCheckingInterval: Math.min(30_000, Math.max(100, shortest / 10)) },
    handler,
  );
  server.keepAliveTimeout = timeouts.keepAliveMs ?? DEFAULT_HTTP_KEEPALIVE_TIMEOUT_MS;
  server.on("clientError", answerParseError);
  return server;
}

export interface RunningServer {
  /** The bound ports; undefined for a listener that is not allowed. */
  httpPort?: number;
  grpcPort?: number;
  metricsPort?: number;
  sagemakerPort?: number;
  vertexAiPort?: number;
  /** The page's address (http://localhost:<port>/ui/ when bound to loopback or all addresses); undefined when it is off. */
  uiUrl?: string;
  /** Requests being served right now, over either protocol. */
  inflight(): number;
  /**
   * Reports not ready at once and keeps accepting and answering for `drainMs` (the drain
   * window: load balancers take that long to stop sending here), then stops accepting, lets
   * in-flight requests finish (at most timeoutMs), closes every connection and unloads every model.
   */
  shutdown(timeoutMs: number, drainMs?: number): Promise<{ timedOut: boolean }>;
}

/**
 * A health Watch stays open for as long as its client likes; it is not a
 * request for shutdown to wait on (the session is destroyed after the rest finish).
 */
const HEALTH_WATCH = "/grpc.health.v1.Health/Watch";

/** Where a browser finds the page: localhost for a loopback or wildcard address, else the address itself. */
function pageUrl(host: string, port: number): string {
  const local = ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", ""].includes(host);
  const name = local ? "localhost" : host.includes(":") ? `[${host}]` : host;
  return `http://${name}:${port}/ui/`;
}

/** The server-wide bound on decompressed requests in flight (--max-inflight-decompressed-bytes). */
function decompressionBudgetOf(options: ServerOptions): DecompressionBudget {
  const limit = options.maxInflightDecompressedBytes ?? DEFAULT_DECOMPRESSION_BUDGET_BYTES;
  return new DecompressionBudget(limit, "--max-inflight-decompressed-bytes");
}

function listen(server: http.Server | http2.Http2Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

/**
 * Counts requests in flight on every listener (a gRPC stream, an HTTP request) and, at shutdown,
 * drains them: new requests on open keep-alive connections are told `Connection: close`, and
 * `drain` resolves once none is left (or the deadline passes).
 */
class RequestsInFlight {
  active = 0;
  /** Shutdown has begun (the drain window included): HTTP answers say `Connection: close`. */
  stopping = false;
  /** The drain window is over: the listeners are closing, a new gRPC session gets GOAWAY. */
  closing = false;
  /** The open connections of the HTTP listeners that count requests, for shutdown to drain. */
  readonly httpSockets = new Set<net.Socket>();
  // While shutdown drains: called whenever a request finishes or an HTTP connection closes.
  private onChange: (() => void) | undefined;
  private readonly done = () => {
    this.active--;
    this.onChange?.();
  };

  countGrpc(grpc: http2.Http2Server | http2.Http2SecureServer): void {
    grpc.on("stream", (stream, headers) => {
      if (headers[":path"] === HEALTH_WATCH) return;
      this.active++;
      stream.on("close", this.done);
    });
  }

  countHttp(server: http.Server): void {
    // Before the handler (prepended), so the header is set before any answer is written.
    server.prependListener("request", (req, res) => {
      if (req.url === HEALTH_WATCH) return;
      this.active++;
      // Keep-alive connections would otherwise keep bringing new requests during shutdown.
      if (this.stopping) res.setHeader("connection", "close");
      res.on("close", this.done);
    });
    server.on("connection", (socket: net.Socket) => {
      this.httpSockets.add(socket);
      socket.once("close", () => {
        this.httpSockets.delete(socket);
        this.onChange?.();
      });
    });
  }

  /**
   * Waits until no request is in flight and no HTTP connection is open (one with no request is
   * kept only until `graceEnd`, a request its client just sent may be on the wire), or until
   * `timeoutMs` has passed; true when it timed out.
   */
  drain(began: number, graceEnd: number, timeoutMs: number): Promise<boolean> {
    return new Promise<boolean>((resolve) => {
      const finish = (timedOut: boolean) => {
        clearTimeout(grace);
        clearTimeout(deadline);
        this.onChange = undefined;
        resolve(timedOut);
      };
      this.onChange = () => {
        if (this.active === 0 && (this.httpSockets.size === 0 || Date.now() >= graceEnd)) finish(false);
      };
      const grace = setTimeout(() => this.onChange?.(), graceEnd - began);
      const deadline = setTimeout(() => finish(true), timeoutMs);
      this.onChange();
    });
  }
}

/** What the listeners share: the server's identity for metadata, its logger and its bounds. */
interface Shared {
  manager: RepositoryManager;
  options: ServerOptions;
  serverName: string;
  serverVersion: string;
  extensions: string[];
  decompressionBudget: DecompressionBudget;
  /** One bound on BYTES tensors in flight for every port. */
  bytesInFlight: BytesInFlight;
  timeouts: HttpTimeouts;
}

/** The gRPC and health services, as the gRPC port and the HTTP port's Connect routes serve them. */
function serveOptionsOf({ options, serverName, serverVersion, extensions, bytesInFlight }: Shared) {
  return {
    serverName,
    serverVersion,
    bytesInFlight,
    extensions,
    logSettings: options.logSettings,
    tracing: options.tracing,
    sharedMemory: options.sharedMemory,
    // gRPC-Web and Connect calls on the HTTP port are the gRPC protocol: the gRPC pattern holds for them.
    forwardHeaders: options.forwardHeaders?.grpc,
    // Error detail withheld from clients (paths, addresses) goes to the log.
    logger: options.logger,
  };
}

/** gRPC: each HTTP/2 stream is one call. A session opened after the drain window gets GOAWAY straight away. */
function grpcListener(shared: Shared, inFlight: RequestsInFlight) {
  const { options, manager, decompressionBudget } = shared;
  const grpc = createGrpcServer(manager, {
    ...serveOptionsOf(shared),
    maxInputBytes: options.grpcMaxInputBytes,
    maxInputFlag: "--grpc-max-input-size",
    decompressionBudget,
    tls: options.grpcTls,
    restrictions: options.grpcRestrictions,
    responseCompression: options.grpcResponseCompression,
    maxUnreadAnswerBytes: options.grpcMaxUnreadAnswerBytes,
  });
  grpc.server.on("session", (s) => {
    if (inFlight.closing) s.close();
    else manageGrpcConnection(s, options.grpcConnections ?? {}, options.logger);
  });
  inFlight.countGrpc(grpc.server);
  return grpc;
}

function restContextOf(shared: Shared): RestContext {
  const { manager, options, serverName, serverVersion, extensions, decompressionBudget, bytesInFlight } = shared;
  return {
    registry: manager,
    bytesInFlight,
    serverName,
    serverVersion,
    extensions,
    logger: options.logger,
    maxInputBytes: options.httpMaxInputBytes,
    maxCompressedAnswerBytes: options.httpMaxCompressedAnswerBytes,
    decompressionBudget,
    logSettings: options.logSettings,
    tracing: options.tracing,
    sharedMemory: options.sharedMemory,
    restrictions: options.httpRestrictions,
    forwardHeaders: options.forwardHeaders?.http,
  };
}

/** The page (/ui): off with --ui false, and whenever --http-restricted-api guards any part of the API. */
function pageHandler(options: ServerOptions): ReturnType<typeof uiHandler> | undefined {
  const uiAssets = options.ui === false ? undefined : readUiAssets(undefined, options.repositories);
  const restricted = Object.keys(options.httpRestrictions ?? {}).length > 0;
  if (uiAssets && restricted) {
    options.logger.info("the page (/ui) is off: the HTTP API is restricted (--http-restricted-api)");
  } else if (uiAssets?.size === 0) options.logger.debug("the page (/ui) is off: it was not built (dist/ui)");
  return uiAssets && uiAssets.size > 0 && !restricted ? uiHandler(uiAssets) : undefined;
}

/** HTTP/1.1: REST and the page, with the Connect routes mounted too (gRPC-Web / Connect over HTTP/1.1). */
function httpListener(shared: Shared, ui: ReturnType<typeof uiHandler> | undefined): http.Server {
  const { options, manager, decompressionBudget, timeouts } = shared;
  const rest = restHandler(restContextOf(shared));
  // The recent traces' routes (the page's waterfall, the export), before the REST API.
  const recent = options.tracing?.keeping?.recent;
  const traces = recent && traceRoutes(recent, options.httpRestrictions);
  const fallback: typeof rest =
    ui || traces
      ? (req, res) => {
          if (!ui?.(req, res) && !traces?.(req, res)) rest(req, res);
        }
      : rest;
  return httpServerWith(
    timeouts,
    connectNodeAdapter({
      routes: serveStage(manager, serveOptionsOf(shared)),
      fallback: fallback as NodeHandlerFn,
      // gRPC-Web and Connect calls on this port are HTTP request bodies: --http-max-input-size holds for them too,
      readMaxBytes: options.httpMaxInputBytes ?? DEFAULT_HTTP_MAX_INPUT_BYTES,
      // and the HTTP port's restrictions.
      interceptors: options.httpRestrictions ? [restrictionInterceptor(options.httpRestrictions)] : [],
      ...serverCompression("--http-max-input-size", decompressionBudget),
    }),
    decompressionBudget,
  );
}

/** SageMaker's and Vertex AI's listeners, answered by the REST handler with their binary content types. */
async function cloudListeners(
  shared: Shared,
  metrics: ReturnType<typeof createMetrics>,
): Promise<{ sagemaker?: http.Server; vertexAi?: http.Server }> {
  const { options, decompressionBudget, timeouts } = shared;
  if (!options.sagemaker && !options.vertexAi) return {};
  const cloud = await import("@trellis/frontends/cloud");
  const rest = (binaryMime: string) => restHandler({ ...restContextOf(shared), binaryMime });
  return {
    sagemaker: options.sagemaker
      ? httpServerWith(
          timeouts,
          cloud.sageMakerHandler(rest(cloud.SAGEMAKER_BINARY_MIME), options.sagemaker.options),
          decompressionBudget,
        )
      : undefined,
    vertexAi: options.vertexAi
      ? httpServerWith(
          timeouts,
          cloud.vertexAiHandler(rest(cloud.VERTEX_AI_BINARY_MIME), {
            ...options.vertexAi.options,
            metrics: () => metrics.scrape(),
          }),
          decompressionBudget,
        )
      : undefined,
  };
}

/** Prometheus's scrape endpoint, GET /metrics. */
function metricsListener(metrics: ReturnType<typeof createMetrics>, timeouts: HttpTimeouts): http.Server {
  return httpServerWith(timeouts, (req, res) => {
    if (req.method === "GET" && (req.url ?? "").split("?")[0] === "/metrics") {
      metrics.scrape().then(
        (text) => {
          res.writeHead(200, { "content-type": metrics.register.contentType });
          res.end(text);
        },
        (err) => {
          res.writeHead(500, { "content-type": "text/plain" });
          res.end(String(err));
        },
      );
      return;
    }
    res.writeHead(404, { "content-type": "text/plain" });
    res.end("Not Found");
  });
}

interface Listeners {
  grpc: ReturnType<typeof createGrpcServer>;
  http: http.Server;
  metrics: http.Server;
  sagemaker?: http.Server;
  vertexAi?: http.Server;
}

/** Opens the listeners allowed (one not allowed is never opened; closing it at shutdown is a no-op) and logs each. */
async function openListeners(options: ServerOptions, listeners: Listeners) {
  const { logger, host = "127.0.0.1", httpPort = 8000, grpcPort = 8001, metricsPort = 8002 } = options;
  const allow = { http: true, grpc: true, metrics: true, ...options.allow };
  const at = {
    http: options.addresses?.http ?? host,
    grpc: options.addresses?.grpc ?? host,
    metrics: options.addresses?.metrics ?? host,
  };
  const { sagemaker, vertexAi } = listeners;
  const ports = {
    grpcPort: allow.grpc ? await listen(listeners.grpc.server, grpcPort, at.grpc) : undefined,
    httpPort: allow.http ? await listen(listeners.http, httpPort, at.http) : undefined,
    metricsPort: allow.metrics ? await listen(listeners.metrics, metricsPort, at.metrics) : undefined,
    sagemakerPort: sagemaker && options.sagemaker ? await listen(sagemaker, options.sagemaker.port, host) : undefined,
    vertexAiPort: vertexAi && options.vertexAi ? await listen(vertexAi, options.vertexAi.port, host) : undefined,
  };
  if (allow.grpc) {
    const tls = options.grpcTls !== undefined;
    logger.info({ protocol: "grpc", host: at.grpc, port: ports.grpcPort, tls }, "listening");
  }
  if (allow.http) logger.info({ protocol: "http", host: at.http, port: ports.httpPort }, "listening");
  if (allow.metrics) logger.info({ protocol: "metrics", host: at.metrics, port: ports.metricsPort }, "listening");
  if (sagemaker) logger.info({ protocol: "sagemaker", host, port: ports.sagemakerPort }, "listening");
  if (vertexAi) logger.info({ protocol: "vertex-ai", host, port: ports.vertexAiPort }, "listening");
  return { ports, httpAddress: at.http };
}

const closeServer = (s: http.Server | http2.Http2Server) => new Promise<void>((resolve) => s.close(() => resolve()));

/**
 * Reports not ready at once, keeps accepting and answering through the drain window
 * (`drainMs`), then stops accepting, lets requests in flight finish (at most `timeoutMs`),
 * closes every connection, unloads every model and flushes traces.
 */
async function shutDown(
  shared: Shared,
  listeners: Listeners,
  inFlight: RequestsInFlight,
  metrics: ReturnType<typeof createMetrics>,
  timeoutMs: number,
  drainMs: number,
): Promise<{ timedOut: boolean }> {
  const { manager, options } = shared;
  const { logger } = options;
  // Readiness (HTTP, gRPC health, SageMaker's ping) reports not ready from here on.
  manager.beginShutdown();
  // Keep-alive clients are told to reconnect: their next connection may already go elsewhere.
  inFlight.stopping = true;
  if (drainMs > 0) {
    // A load balancer (Kubernetes' endpoints, a proxy) keeps sending here until it has seen the
    // pod go: a connection refused now would be a request dropped, so everything is still served.
    logger.info({ drainSecs: drainMs / 1000 }, "draining: not ready, still answering until the drain window ends");
    await new Promise((r) => setTimeout(r, drainMs));
  }
  inFlight.closing = true;
  const began = Date.now();
  const httpServers = [listeners.http, listeners.sagemaker, listeners.vertexAi].filter(
    (x): x is http.Server => x !== undefined,
  );
  // Stop accepting. http.Server's close() would also close its idle keep-alive connections
  // at once, and a connection idle here may already carry a request its client has sent:
  // closing it resets that request. So only the listeners close (net.Server's close), and
  // the HTTP connections are drained below.
  const stopListening = (s: http.Server) =>
    new Promise<void>((resolve) => net.Server.prototype.close.call(s, () => resolve()));
  const closed = Promise.all([closeServer(listeners.grpc.server), ...httpServers.map(stopListening)]);
  // GOAWAY: calls in flight finish, new ones go elsewhere.
  for (const s of listeners.grpc.sessions) s.close();
  if (inFlight.active > 0) {
    logger.info(
      { inflight: inFlight.active, timeoutSecs: timeoutMs / 1000 },
      "waiting for in-flight requests to complete",
    );
  }
  const graceEnd = began + Math.min(SHUTDOWN_IDLE_GRACE_MS, timeoutMs);
  const timedOut = await inFlight.drain(began, graceEnd, timeoutMs);
  if (timedOut)
    logger.warn({ inflight: inFlight.active }, "exit timeout expired; closing with requests still in flight");
  for (const s of listeners.grpc.sessions) s.destroy();
  for (const socket of inFlight.httpSockets) socket.destroy();
  await closed;
  // http.Server's own close() now, with no connection left, only stops its timeout checks.
  for (const s of httpServers) s.close();
  await manager.close();
  await options.tracing?.flush();
  metrics.close();
  options.sharedMemory?.close();
  await closeServer(listeners.metrics);
  return { timedOut };
}

export async function startServer(manager: RepositoryManager, options: ServerOptions): Promise<RunningServer> {
  const shared: Shared = {
    manager,
    options,
    serverName: options.serverName ?? SERVER_NAME,
    serverVersion: options.serverVersion ?? SERVER_VERSION,
    // Triton lists system_shared_memory (and cuda_shared_memory) with client shared memory off too.
    extensions: [...EXTENSIONS],
    // One budget for decompressed requests, whichever port they come in on.
    decompressionBudget: decompressionBudgetOf(options),
    bytesInFlight: new BytesInFlight(options.maxInflightBytesTensorBytes ?? DEFAULT_MAX_INFLIGHT_BYTES_TENSOR_BYTES),
    timeouts: options.httpTimeouts ?? {},
  };
  const inFlight = new RequestsInFlight();
  const metrics = createMetrics(manager, options.logger, options.metrics);
  const ui = pageHandler(options);
  const listeners: Listeners = {
    grpc: grpcListener(shared, inFlight),
    http: httpListener(shared, ui),
    metrics: metricsListener(metrics, shared.timeouts),
    ...(await cloudListeners(shared, metrics)),
  };
  // SageMaker's and Vertex AI's requests are counted in flight like HTTP's.
  for (const s of [listeners.http, listeners.sagemaker, listeners.vertexAi]) if (s) inFlight.countHttp(s);
  const { ports, httpAddress } = await openListeners(options, listeners);
  return {
    ...ports,
    uiUrl: ui && ports.httpPort !== undefined ? pageUrl(httpAddress, ports.httpPort) : undefined,
    inflight: () => inFlight.active,
    shutdown: (timeoutMs, drainMs = 0) => shutDown(shared, listeners, inFlight, metrics, timeoutMs, drainMs),
  };
}
