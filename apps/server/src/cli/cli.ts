/**
 * The server's command line: tritonserver's flags where they apply, parsed with
 * commander, and the settings read from them (certificates, restrictions; the cache
 * and tracing settings in cache-config.ts and trace-config.ts).
 * A bad flag or flag file is a UsageError: one line, no stack.
 */
import { open, readFile, stat } from "node:fs/promises";
import { resolve } from "node:path";
import {
  API_CATEGORIES,
  type ApiRestrictions,
  DEFAULT_GRPC_MAX_INPUT_BYTES,
  DEFAULT_HTTP_MAX_COMPRESSED_ANSWER_BYTES,
  DEFAULT_HTTP_MAX_INPUT_BYTES,
  DEFAULT_MAX_INFLIGHT_BYTES_TENSOR_BYTES,
  DEFAULT_MAX_UNREAD_ANSWER_BYTES,
  type GrpcServerTlsOptions,
  headerForwardPattern,
  parseRestriction,
  type ResponseCompressionLevel,
} from "@trellis/frontends";
import type { GrpcTlsOptions } from "@trellis/kserve";
import { DEFAULT_DECOMPRESSION_BUDGET_BYTES } from "@trellis/kserve/wire";
import {
  type ControlMode,
  DEFAULT_MAX_LOAD_BYTES,
  DEFAULT_MAX_LOAD_FILES,
  DEFAULT_MAX_QUEUE_SIZE,
  defaultMaxInstancesPerModel,
} from "@trellis/model-repository";
import { RateLimiter } from "@trellis/runtime";
import { Command, InvalidArgumentError, Option } from "commander";
import type { MetricsOptions } from "../observability/metrics.js";
import type { OtelSettings } from "../observability/otel-settings.js";
import type { TraceValues } from "../observability/tracing.js";
import { SERVER_NAME, SERVER_VERSION } from "../server.js";
import { type CacheChoice, readCacheConfig } from "./cache-config.js";
import { readTraceConfig, type TraceFlags } from "./trace-config.js";
import { addCompatFlags, compatWarnings } from "./triton-flags.js";
import { splitSetting, UsageError } from "./usage.js";

export { UsageError };

const port = (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0 || n > 65535)
    throw new InvalidArgumentError("a port number 0-65535 (0 = any free port)");
  return n;
};
/**
 * The drain window's default: about how long a Kubernetes Service's endpoints (kube-proxy, an
 * ingress) take to drop a terminating pod; the manifests' preStop pause comes on top of it.
 */
export const DEFAULT_SHUTDOWN_DRAIN_SECS = 5;

const seconds = (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n < 0) throw new InvalidArgumentError("a number of seconds");
  return n;
};
/** The drain window: bounded, so a typo cannot keep a stopping server (and its pod) around for days. */
const drainSeconds = (v: string) => {
  const n = seconds(v);
  if (n > 3600) throw new InvalidArgumentError("a number of seconds, at most 3600");
  return n;
};
const positiveSeconds = (v: string) => {
  const n = seconds(v);
  if (n === 0) throw new InvalidArgumentError("a number of seconds greater than 0");
  return n;
};
/** A boolean flag that also takes an explicit value, as tritonserver's do (--flag, --flag true, --flag false). */
const flag = (v: string) => {
  const value = v.toLowerCase();
  if (["true", "1", "yes", "on"].includes(value)) return true;
  if (["false", "0", "no", "off"].includes(value)) return false;
  throw new InvalidArgumentError("true or false");
};
const bytes = (v: string) => {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 1) throw new InvalidArgumentError("a whole number of bytes, at least 1");
  return n;
};
const collect = (v: string, prev: string[] = []) => [...prev, v];
const count = (v: string) => {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 0) throw new InvalidArgumentError("a whole number, 0 or more");
  return n;
};
const positiveCount = (v: string) => {
  const n = count(v);
  if (n === 0) throw new InvalidArgumentError("a whole number, 1 or more");
  return n;
};
const milliseconds = (v: string) => {
  const n = Number(v);
  if (!Number.isFinite(n) || n <= 0) throw new InvalidArgumentError("a number of milliseconds greater than 0");
  return n;
};
/** A header forwarding pattern (a regular expression), checked at start. */
const headerPattern = (v: string) => {
  try {
    return headerForwardPattern(v);
  } catch (err) {
    throw new InvalidArgumentError(`a regular expression (${(err as Error).message})`);
  }
};
/** --log-verbose's level: a whole number, or true (1) / false (0) as tritonserver takes it. */
const verboseLevel = (v: string) => {
  const value = v.toLowerCase();
  if (value === "true") return 1;
  if (value === "false") return 0;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0 || n >= 2 ** 32) throw new InvalidArgumentError("a level 0 or more, or true/false");
  return n;
};

export const program = new Command("trellis-server")
  .description("Serve a Triton-layout model repository over KServe v2 gRPC and HTTP/REST, with Prometheus metrics.")
  .version(SERVER_VERSION)
  .option(
    "--model-repository <path>",
    "model repository directory (config.pbtxt + version folders per model); repeat for several (required unless --default-model-repository)",
    collect,
    [],
  )
  .option(
    "--default-model-repository <path>",
    "the repository served when no --model-repository (or --model-store) is given; one that is given replaces it (what `pnpm start` passes: ../../models)",
  )
  .option("--model-store <path>", "the same as --model-repository, as tritonserver's", collect, [])
  .option(
    "--id <name>",
    "the server's name, in server metadata (GET /v2, gRPC ServerMetadata); Triton's, by default, which its example clients check",
    SERVER_NAME,
  )
  .option("--server-version <version>", "the version server metadata reports", SERVER_VERSION)
  .option("--http-port <port>", "HTTP/REST (KServe v2 + Triton extensions) port; 0 picks a free port", port, 8000)
  .option(
    "--grpc-port <port>",
    "gRPC (inference.GRPCInferenceService + grpc.health.v1) port; 0 picks a free port",
    port,
    8001,
  )
  .option("--metrics-port <port>", "Prometheus /metrics port; 0 picks a free port", port, 8002)
  .option(
    "--host <address>",
    "address every listener binds to (unless one of the three below says otherwise)",
    "127.0.0.1",
  )
  .option("--http-address <address>", "address the HTTP/REST port binds to (default: --host)")
  .option("--grpc-address <address>", "address the gRPC port binds to (default: --host)")
  .option("--metrics-address <address>", "address the metrics port binds to (default: --host)")
  .option(
    "--http-max-input-size <bytes>",
    "largest HTTP/REST request body accepted; larger ones get 400",
    bytes,
    DEFAULT_HTTP_MAX_INPUT_BYTES,
  )
  .option(
    "--http-max-compressed-answer-size <bytes>",
    "largest infer answer compressed for a client that accepts gzip or deflate; larger ones go uncompressed (0: never compress)",
    bytes,
    DEFAULT_HTTP_MAX_COMPRESSED_ANSWER_BYTES,
  )
  .option(
    "--http-headers-timeout <ms>",
    "an HTTP request's headers must arrive within this long of its start, or it is answered 408 and its connection closed; 0: no limit",
    count,
    60_000,
  )
  .option(
    "--http-request-timeout <ms>",
    "an HTTP request, body included, must arrive within this long of its start, or it is answered 408 and its connection closed (the default leaves a 64 MiB body about 0.5 MB/s); 0: no limit",
    count,
    120_000,
  )
  .option(
    "--http-keepalive-timeout <ms>",
    "how long an HTTP keep-alive connection may wait for its next request before it is closed",
    count,
    5_000,
  )
  .option(
    "--grpc-max-input-size <bytes>",
    "largest gRPC request message accepted on the gRPC port, compressed ones once inflated; larger ones get RESOURCE_EXHAUSTED (default 64 MiB, as HTTP; Triton's is 2^31-1)",
    bytes,
    DEFAULT_GRPC_MAX_INPUT_BYTES,
  )
  .addOption(
    new Option(
      "--model-control-mode <mode>",
      "none: load every model at start; explicit: load only --load-model, then load/unload by API; poll: load every model, then rescan the repository every --repository-poll-secs",
    )
      .choices(["none", "explicit", "poll"])
      .default("none"),
  )
  .option("--load-model <name>", 'model to load at start in explicit mode ("*" = all); repeatable', collect, [])
  .option("--repository-poll-secs <secs>", "rescan interval in poll mode", positiveSeconds, 15)
  .option(
    "--strict-readiness [bool]",
    "report ready only when every model asked for is ready (one that failed to load keeps the server not ready, as tritonserver); false: whenever the server is up",
    flag,
    true,
  )
  .option(
    "--exit-on-error [bool]",
    "exit (code 1) if any model fails to load at start, as tritonserver; false: serve the rest (the server then reports not ready while --strict-readiness)",
    flag,
    true,
  )
  .option(
    "--strict-model-config [bool]",
    "require a complete config.pbtxt (no filling in from the model file)",
    flag,
    false,
  )
  .option("--disable-auto-complete-config", "the same as --strict-model-config true: config.pbtxt must be complete")
  .option(
    "--model-load-thread-count <n>",
    "how many models (or versions) load at once, at start and when polled; ensembles wait for their steps",
    positiveCount,
    4,
  )
  .option(
    "--model-load-retry-count <n>",
    "how many more times a model that fails to load is tried before it is reported UNAVAILABLE",
    count,
    0,
  )
  .addOption(
    new Option(
      "--rate-limit <mode>",
      "execution_count: model instances whose instance_group has a rate_limiter run only while the resources it lists are free, and priority picks who runs next, across models; off: each runs as soon as it is free",
    )
      .choices(["off", "execution_count"])
      .default("off"),
  )
  .option(
    "--rate-limit-resource <name:count[:device]>",
    "how many of a rate limiter resource there are (default: the most any loaded instance needs); repeatable",
    collect,
    [],
  )
  .option(
    "--default-max-queue-size <n>",
    "the queue bound of a model whose config sets no max_queue_size (Triton's dynamic_batching default_queue_policy max_queue_size): a request finding that many pending is refused at once, UNAVAILABLE (HTTP 503); an ensemble admits no more at once than its tightest step's bound; 0: unbounded (Triton's default)",
    count,
    DEFAULT_MAX_QUEUE_SIZE,
  )
  .option(
    "--max-instances-per-model <n>",
    "most instances one model's config may ask for, summed over its instance_group entries (each a thread or a session): a config asking for more, on disk or in a load request, is refused 400 / INVALID_ARGUMENT naming this flag (default: two per CPU core, at least 4)",
    positiveCount,
    defaultMaxInstancesPerModel(),
  )
  .option(
    "--max-load-files <n>",
    "most file overrides (file:<path>) one model load request may carry; more are refused 400 / INVALID_ARGUMENT naming this flag, before anything is written",
    positiveCount,
    DEFAULT_MAX_LOAD_FILES,
  )
  .option(
    "--python-executable <path>",
    'the python3 that runs Python models (backend "python"), one process per instance; it needs numpy and what each model.py imports',
    "python3",
  )
  .option(
    "--python-execute-timeout-secs <secs>",
    "longest one execute(requests) of a Python model may take; past it its process is stopped, its requests fail UNAVAILABLE naming the model, and the next request starts a fresh process",
    positiveCount,
    60,
  )
  .option(
    "--python-max-answer-bytes <bytes>",
    "most bytes a Python model's process may send as one answer (or one BLS request, or unread responses of one decoupled request), judged from its length prefix; past it that execution's requests fail RESOURCE_EXHAUSTED naming the model and this flag, the answer dropped unread and the process running on (a BLS request past it stops the process) (default 1 GiB)",
    bytes,
    1 << 30,
  )
  .option(
    "--python-max-responses <n>",
    "most responses a decoupled Python model may send one request; past it that request fails RESOURCE_EXHAUSTED naming the model and its response sender is closed",
    positiveCount,
    100_000,
  )
  .option(
    "--max-load-bytes <bytes>",
    "most bytes one model load request's file overrides may hold together (default 1 GiB); more are refused 400 / INVALID_ARGUMENT naming this flag, before anything is written",
    bytes,
    DEFAULT_MAX_LOAD_BYTES,
  )
  .option(
    "--grpc-max-unread-answer-bytes <bytes>",
    "most bytes of gRPC answers written and not yet read by their clients, across all connections; past it connections are reset (GOAWAY ENHANCE_YOUR_CALM): first those that took nothing for 1 s, the largest first, then those reading too slowly to clear what they hold in 30 s; a connection reading at a pace that clears its answers is never cut (default 256 MiB)",
    bytes,
    DEFAULT_MAX_UNREAD_ANSWER_BYTES,
  )
  .option(
    "--max-inflight-decompressed-bytes <bytes>",
    "most bytes of decompressed request messages and bodies held at once across all requests on every port (each request's share is given back when it is answered); a compressed request that would pass it is refused RESOURCE_EXHAUSTED (HTTP 429) naming this flag (default 256 MiB)",
    bytes,
    DEFAULT_DECOMPRESSION_BUDGET_BYTES,
  )
  .option(
    "--max-inflight-bytes-tensor-bytes <bytes>",
    "most bytes BYTES (string) tensors may hold while their requests are in flight, across every port: each request's BYTES inputs count their framed bytes plus 128 bytes an element (what an element costs as the model works on it), reserved before the model's queue and given back when the request is answered; a request past it is refused RESOURCE_EXHAUSTED (HTTP 429) naming this flag (default 2 GiB: one 10,485,760-element request at a time)",
    bytes,
    DEFAULT_MAX_INFLIGHT_BYTES_TENSOR_BYTES,
  )
  .option(
    "--backend-config <[backend,]setting=value>",
    "backend settings, as tritonserver's: default-max-batch-size=<n> (or onnxruntime,default-max-batch-size=<n>): the max_batch_size auto-complete gives a batchable model whose config sets none (default 4); repeatable",
    collect,
    [],
  )
  .option(
    "--endpoints <file>",
    'JSON file mapping model names to KServe v2 gRPC URLs ({"resnet50_preprocess": "http://host:8001"}); ensemble steps listed there are called remotely instead of loaded',
  )
  .option(
    "--cache-config <cache,key=value>",
    "response cache, as tritonserver's: local,size=<bytes>, or a Redis server the replicas share, with Triton's redis cache settings: redis,host=<host> and redis,port=<port> (both required), redis,user= / redis,password= (else $TRITONCACHE_REDIS_USERNAME / $TRITONCACHE_REDIS_PASSWORD), redis,db= (0), redis,connect_timeout= / redis,socket_timeout= (ms, 0: none), redis,pool_size= (1), redis,wait_timeout= (ms, 1000), redis,tls_enabled=true with redis,cacert= / cacert_dir= / cert= / key= / sni=; models opt in with response_cache { enable: true }; repeatable",
    collect,
    [],
  )
  .option(
    "--response-cache-byte-size <bytes>",
    "deprecated in tritonserver: --cache-config local,size=<bytes> (0: no cache); not with --cache-config",
  )
  .option(
    "--http-restricted-api <categories:header=value>",
    `HTTP endpoint groups (${API_CATEGORIES.join(", ")}) that answer 403 unless the request has this header and value, e.g. model-repository,logging:admin-key=secret; repeatable`,
    collect,
    [],
  )
  .option(
    "--http-header-forward-pattern <regex>",
    "HTTP/REST infer requests' headers whose names match become string request parameters, for the model to read (case-insensitive unless the pattern starts with \"(?-i)\"; a request's own parameter of the same name wins)",
    headerPattern,
  )
  .option(
    "--grpc-header-forward-pattern <regex>",
    "the same for gRPC ModelInfer / ModelStreamInfer calls' metadata (gRPC-Web and Connect calls on the HTTP port too)",
    headerPattern,
  )
  .option(
    "--grpc-restricted-protocol <categories:header=value>",
    "the same for gRPC methods, the key sent as the header triton-grpc-protocol-<header> (refused with UNAVAILABLE, as tritonserver); repeatable",
    collect,
    [],
  )
  .option(
    "--allow-client-shm [bool]",
    "let clients register system shared memory regions (/dev/shm) and name them for inputs and outputs, as tritonserver's",
    flag,
    false,
  )
  .option(
    "--allow-unsafe-load-overrides [bool]",
    "let model load requests (explicit mode) upload executable code (model.js, .node) and change a model's parameters, which name the code it runs, the files it reads and the endpoints it connects to: anyone who can load models can then run code as the server (see SECURITY.md)",
    flag,
    false,
  )
  .option("--allow-http [bool]", "open the HTTP/REST port", flag, true)
  .option(
    "--ui [bool]",
    "serve the page on the HTTP port (/ui; off whenever --http-restricted-api is given)",
    flag,
    true,
  )
  .option("--allow-grpc [bool]", "open the gRPC port", flag, true)
  .option("--allow-metrics [bool]", "open the metrics port", flag, true)
  .option(
    "--allow-sagemaker [bool]",
    "serve SageMaker's GET /ping and POST /invocations (for the model SAGEMAKER_TRITON_DEFAULT_MODEL_NAME names), and its multi-model endpoint's /models routes (explicit mode), on --sagemaker-port",
    flag,
    false,
  )
  .option("--sagemaker-port <port>", "the SageMaker endpoint's port; 0 picks a free port", port, 8080)
  .option(
    "--sagemaker-model-root <dir>",
    "the folder the multi-model endpoint's POST /models may load from: a url outside it is refused",
    "/opt/ml/models",
  )
  .option(
    "--allow-vertex-ai [bool]",
    "serve Vertex AI Prediction's health and predict routes (AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE) on --vertex-ai-port (default: true when AIP_MODE=PREDICTION)",
    flag,
    process.env.AIP_MODE === "PREDICTION",
  )
  .option(
    "--vertex-ai-port <port>",
    "the Vertex AI endpoint's port (default AIP_HTTP_PORT, else 8080); 0 picks a free port",
    port,
    Number(process.env.AIP_HTTP_PORT) || 8080,
  )
  .option(
    "--vertex-ai-default-model <name>",
    "the model predictions go to (default: the one model loaded; with several, it must be given)",
  )
  .option(
    "--allow-cpu-metrics [bool]",
    "publish the host's CPU utilization and memory (nv_cpu_*) on the metrics port",
    flag,
    true,
  )
  .option(
    "--allow-gpu-metrics [bool]",
    "accepted as tritonserver's; this server uses no GPU, so there are no GPU metrics either way",
    flag,
    true,
  )
  .option(
    "--metrics-interval-ms <ms>",
    "how often the per-interval metrics (nv_cpu_utilization, over the last interval) are sampled",
    milliseconds,
    2000,
  )
  .option("--grpc-use-ssl [bool]", "serve gRPC over TLS (needs --grpc-server-cert and --grpc-server-key)", flag, false)
  .option(
    "--grpc-use-ssl-mutual [bool]",
    "serve gRPC over mutual TLS: clients must present a certificate that chains to --grpc-root-cert (implies --grpc-use-ssl)",
    flag,
    false,
  )
  .option("--grpc-server-cert <path>", "PEM certificate (chain) the gRPC port presents")
  .option("--grpc-server-key <path>", "PEM private key of --grpc-server-cert")
  .option("--grpc-root-cert <path>", "PEM CA certificate(s) client certificates must chain to (mutual TLS)")
  .addOption(
    new Option(
      "--grpc-infer-response-compression-level <level>",
      "compress gRPC inference responses (ModelInfer, ModelStreamInfer) with the algorithm gRPC core picks for the level among those the client accepts: low gzip, medium and high deflate when both are",
    )
      .choices(["none", "low", "medium", "high"])
      .default("none"),
  )
  .option(
    "--grpc-keepalive-time <ms>",
    "how long a gRPC connection may go without a frame from its client before the server pings it",
    milliseconds,
    7_200_000,
  )
  .option(
    "--grpc-keepalive-timeout <ms>",
    "how long the server waits for a ping's acknowledgement before closing the connection",
    milliseconds,
    20_000,
  )
  .option(
    "--grpc-keepalive-permit-without-calls [bool]",
    "ping connections with no call in flight too (default: only those with calls in flight)",
    flag,
    false,
  )
  .option(
    "--grpc-http2-max-pings-without-data <n>",
    "keepalive pings the server sends before a call's headers or data must go out again; 0: no limit",
    count,
    2,
  )
  .option(
    "--grpc-http2-min-recv-ping-interval-without-data <ms>",
    "with --grpc-keepalive-permit-without-calls, the shortest gap between a client's pings on a connection with no call that is not a strike (without it: 2 hours)",
    milliseconds,
    300_000,
  )
  .option(
    "--grpc-http2-max-ping-strikes <n>",
    "pings too close together on a connection with no call that are let go before it is closed with GOAWAY too_many_pings; 0: no limit",
    count,
    2,
  )
  .option(
    "--grpc-max-connection-age <ms>",
    "close each gRPC connection this long after it opened (GOAWAY: calls in flight finish, new ones go to a new connection)",
    milliseconds,
  )
  .option(
    "--grpc-max-connection-age-grace <ms>",
    "after --grpc-max-connection-age, how long calls in flight may take before the connection is cut",
    milliseconds,
  )
  .option(
    "--grpc-max-connection-idle <ms>",
    "close a gRPC connection with no call in flight for this long (GOAWAY; clients reconnect for their next call); 0: never",
    count,
    300_000,
  )
  .option(
    "--grpc-handshake-timeout <ms>",
    "close a gRPC connection whose client has not sent the HTTP/2 preface and SETTINGS within this long of connecting; 0: never",
    count,
    20_000,
  )
  .option(
    "--endpoints-root-cert <path>",
    "PEM CA certificate(s) to trust for https:// --endpoints (default: the system's)",
  )
  .option("--endpoints-client-cert <path>", "PEM client certificate for https:// --endpoints that require mutual TLS")
  .option("--endpoints-client-key <path>", "PEM private key of --endpoints-client-cert")
  .option(
    "--endpoints-timeout-secs <secs>",
    "deadline of each call to an --endpoints model (a decoupled one's: of each response); past it the request fails DEADLINE_EXCEEDED naming the step; 0: none",
    seconds,
    30,
  )
  .option(
    "--endpoints-keepalive-time <ms>",
    "HTTP/2 keepalive ping to an --endpoints server after this long without a frame while calls are in flight; 0: none",
    count,
    10_000,
  )
  .option(
    "--endpoints-keepalive-timeout <ms>",
    "a keepalive ping to an --endpoints server unanswered this long closes the connection, failing its calls UNAVAILABLE",
    milliseconds,
    5_000,
  )
  .option(
    "--exit-timeout-secs <secs>",
    "on SIGINT/SIGTERM, how long in-flight requests may take to finish (after the drain window)",
    seconds,
    30,
  )
  .option(
    "--shutdown-drain-secs <secs>",
    "on SIGTERM, readiness reports not ready at once while the server keeps accepting and answering this long (load balancers, Kubernetes' endpoints, take that long to stop sending here); then it stops accepting and waits for in-flight requests. SIGINT skips it; 0: none",
    drainSeconds,
    DEFAULT_SHUTDOWN_DRAIN_SECS,
  )
  .option("--log-file <path>", "write the logs (JSON lines) to this file instead of stdout")
  .addOption(
    new Option(
      "--log-style <style>",
      "json: one JSON object per line (for log shippers); text: one readable line per entry (time, level, message, key=value fields). Default: text when stdout is a terminal (and no --log-file), else json",
    ).choices(["json", "text"]),
  )
  .addOption(
    new Option(
      "--log-verbose [level]",
      "verbose (debug) logging: level > 0 (1 when given without one, or true); changeable at run time through /v2/logging",
    )
      .argParser(verboseLevel)
      .preset("1")
      .default(0),
  )
  .option("--log-info [bool]", "info-level logging; changeable at run time through /v2/logging", flag, true)
  .option("--log-warning [bool]", "warning-level logging; changeable at run time through /v2/logging", flag, true)
  .option("--log-error [bool]", "error-level logging; changeable at run time through /v2/logging", flag, true)
  .addOption(
    new Option(
      "--log-format <format>",
      'each log line\'s "time": default (milliseconds since the epoch) or ISO8601; changeable at run time through /v2/logging',
    )
      .choices(["default", "ISO8601"])
      .default("default"),
  )
  .option(
    "--metrics-config <setting>",
    "latency metrics, as tritonserver's: counter_latencies=<bool> (the *_duration_us counters; default true), summary_latencies=<bool> (*_summary_us quantiles over the last 60 s; default false), summary_quantiles=<q>:<error>,... (default 0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001), histogram_latencies=<bool> (nv_inference_first_response_histogram_ms for decoupled models; default false); repeatable",
    collect,
    [],
  )
  .option(
    "--trace-config <setting>",
    "request tracing, as tritonserver's: level=TIMESTAMPS and/or level=TENSORS (or OFF), rate=<n> (every n-th request; default 1000), count=<n> (-1: no limit), mode=triton|opentelemetry; triton,file=<path> (needed to trace in mode triton), triton,log-frequency=<n> (write every n traces to <path>.<i>; 0: all to <path> at exit); opentelemetry,url=<OTLP/HTTP traces URL> (default http://localhost:4318/v1/traces), opentelemetry,resource=<key>=<value>, opentelemetry,bsp_max_queue_size|bsp_schedule_delay|bsp_max_export_batch_size=<n>; repeatable; mode triton's settings are changeable at run time through /v2/trace/setting",
    collect,
    [],
  )
  .option("--trace-file <path>", "deprecated in tritonserver: --trace-config triton,file=<path>")
  .option("--trace-level <level>", "deprecated in tritonserver: --trace-config level=<level>", collect, [])
  .option("--trace-rate <n>", "deprecated in tritonserver: --trace-config rate=<n>")
  .option("--trace-count <n>", "deprecated in tritonserver: --trace-config count=<n>")
  .option("--trace-log-frequency <n>", "deprecated in tritonserver: --trace-config triton,log-frequency=<n>")
  .option(
    "--fetch-models [bool]",
    "fetch the seed's missing ResNet-50 weights and labels at start (offline: the bundled MobileNetV2, a real classifier, and a line saying so), into this project's own models/ folder only: a repository given elsewhere is never written to (what `pnpm start` passes)",
    flag,
    false,
  )
  .option(
    "--no-fetch-models",
    "do not fetch (or fall back to the bundled model for) missing ResNet-50 weights at start (the default)",
  );
addCompatFlags(program);

export interface Flags extends TraceFlags {
  modelRepository: string[];
  modelStore: string[];
  id: string;
  serverVersion: string;
  disableAutoCompleteConfig?: boolean;
  modelLoadThreadCount: number;
  modelLoadRetryCount: number;
  defaultMaxQueueSize: number;
  maxInstancesPerModel: number;
  maxLoadFiles: number;
  maxLoadBytes: number;
  pythonExecutable: string;
  pythonExecuteTimeoutSecs: number;
  pythonMaxAnswerBytes: number;
  pythonMaxResponses: number;
  maxInflightDecompressedBytes: number;
  maxInflightBytesTensorBytes: number;
  grpcMaxUnreadAnswerBytes: number;
  rateLimit: "off" | "execution_count";
  rateLimitResource: string[];
  responseCacheByteSize?: string;
  allowCpuMetrics: boolean;
  allowGpuMetrics: boolean;
  metricsIntervalMs: number;
  grpcInferResponseCompressionLevel: ResponseCompressionLevel;
  grpcKeepaliveTime: number;
  grpcKeepaliveTimeout: number;
  grpcKeepalivePermitWithoutCalls: boolean;
  grpcHttp2MaxPingsWithoutData: number;
  grpcHttp2MinRecvPingIntervalWithoutData: number;
  grpcHttp2MaxPingStrikes: number;
  grpcMaxConnectionAge?: number;
  grpcMaxConnectionAgeGrace?: number;
  grpcMaxConnectionIdle: number;
  grpcHandshakeTimeout: number;
  httpHeadersTimeout: number;
  httpRequestTimeout: number;
  httpKeepaliveTimeout: number;
  logInfo: boolean;
  logWarning: boolean;
  logError: boolean;
  logFormat: "default" | "ISO8601";
  logStyle?: "json" | "text";
  defaultModelRepository?: string;
  httpPort: number;
  grpcPort: number;
  metricsPort: number;
  host: string;
  httpAddress?: string;
  grpcAddress?: string;
  metricsAddress?: string;
  strictReadiness: boolean;
  exitOnError: boolean;
  httpMaxInputSize: number;
  httpMaxCompressedAnswerSize: number;
  grpcMaxInputSize: number;
  modelControlMode: ControlMode;
  loadModel: string[];
  repositoryPollSecs: number;
  strictModelConfig: boolean;
  endpoints?: string;
  backendConfig: string[];
  exitTimeoutSecs: number;
  shutdownDrainSecs: number;
  logVerbose: number;
  logFile?: string;
  cacheConfig: string[];
  httpRestrictedApi: string[];
  grpcRestrictedProtocol: string[];
  httpHeaderForwardPattern?: RegExp;
  grpcHeaderForwardPattern?: RegExp;
  allowClientShm: boolean;
  allowUnsafeLoadOverrides: boolean;
  allowHttp: boolean;
  ui: boolean;
  allowGrpc: boolean;
  allowMetrics: boolean;
  allowSagemaker: boolean;
  sagemakerPort: number;
  sagemakerModelRoot: string;
  allowVertexAi: boolean;
  vertexAiPort: number;
  vertexAiDefaultModel?: string;
  grpcUseSsl: boolean;
  grpcUseSslMutual: boolean;
  grpcServerCert?: string;
  grpcServerKey?: string;
  grpcRootCert?: string;
  endpointsRootCert?: string;
  endpointsClientCert?: string;
  endpointsClientKey?: string;
  endpointsTimeoutSecs: number;
  endpointsKeepaliveTime: number;
  endpointsKeepaliveTimeout: number;
  metricsConfig: string[];
  fetchModels: boolean;
}

/** The file a flag names; one that cannot be read is a UsageError naming the flag. */
function readFlagFile(option: string, path: string): Promise<Buffer> {
  return readFile(resolve(path)).catch((err: Error) => {
    throw new UsageError(`${option} ${path}: ${err.message}`);
  });
}

/** The gRPC port's TLS settings from the flags, or undefined for cleartext; a missing file or flag is a startup error. */
async function grpcTls(flags: Flags): Promise<GrpcServerTlsOptions | undefined> {
  if (!flags.grpcUseSsl && !flags.grpcUseSslMutual) return undefined;
  const read = async (option: string, path: string | undefined) => {
    if (!path)
      throw new UsageError(`${option} is required with --grpc-use-ssl${flags.grpcUseSslMutual ? "-mutual" : ""}`);
    return readFlagFile(option, path);
  };
  return {
    cert: await read("--grpc-server-cert", flags.grpcServerCert),
    key: await read("--grpc-server-key", flags.grpcServerKey),
    ...(flags.grpcUseSslMutual
      ? { ca: await read("--grpc-root-cert", flags.grpcRootCert), requireClientCert: true }
      : {}),
  };
}

/**
 * The rate limiter for --rate-limit execution_count, with --rate-limit-resource's counts
 * ("<name>:<count>[:<device>]", as tritonserver's). Every instance here runs on the host, which
 * keeps one count per resource: a device other than 0 is refused rather than ignored.
 */
function rateLimiter(flags: Flags, warnings: string[]): RateLimiter | undefined {
  const given: Record<string, number> = {};
  for (const spec of flags.rateLimitResource) {
    const [name = "", count = "", device, ...rest] = spec.split(":");
    const n = Number(count);
    if (!name || rest.length > 0 || !/^\d+$/.test(count) || !Number.isSafeInteger(n)) {
      throw new UsageError(`--rate-limit-resource ${spec}: expected <name>:<count>[:<device>]`);
    }
    if (device !== undefined && device !== "0") {
      throw new UsageError(
        `--rate-limit-resource ${spec}: this server keeps one count per resource, for device 0 (the host)`,
      );
    }
    given[name] = n;
  }
  if (flags.rateLimit === "off") {
    if (flags.rateLimitResource.length > 0) {
      warnings.push("--rate-limit-resource has no effect with --rate-limit off");
    }
    return undefined;
  }
  return new RateLimiter(given);
}

/** Restricted endpoint groups from repeated `option` values, or undefined for none. */
const isLoopback = (address: string) =>
  address === "localhost" || address === "::1" || address.startsWith("127.") || address.startsWith("::ffff:127.");

/**
 * In explicit mode the repository API loads models on a client's word: reachable from other
 * machines without a key, it is anyone's. Says so for each port where that is the case.
 */
export function repositoryApiWarnings(
  flags: Pick<
    Flags,
    "modelControlMode" | "allowHttp" | "allowGrpc" | "host" | "httpAddress" | "grpcAddress" | "allowUnsafeLoadOverrides"
  >,
  http: ApiRestrictions | undefined,
  grpc: ApiRestrictions | undefined,
): string[] {
  const warnings: string[] = [];
  if (flags.modelControlMode === "explicit") {
    const open = (allowed: boolean, address: string, restricted: ApiRestrictions | undefined) =>
      allowed && !isLoopback(address) && !restricted?.["model-repository"];
    const ports = [
      open(flags.allowHttp, flags.httpAddress ?? flags.host, http) && "HTTP (--http-restricted-api)",
      open(flags.allowGrpc, flags.grpcAddress ?? flags.host, grpc) && "gRPC (--grpc-restricted-protocol)",
    ].filter(Boolean);
    if (ports.length > 0) {
      warnings.push(
        `--model-control-mode=explicit with the model repository API open to the network on ${ports.join(" and ")}: anyone who reaches the port can load and unload models; require a key with model-repository:<header>=<secret> on each (see SECURITY.md)`,
      );
    }
  }
  if (flags.allowUnsafeLoadOverrides) {
    warnings.push(
      "--allow-unsafe-load-overrides: model load requests may upload code that runs as this server and point models at any file or endpoint",
    );
  }
  return warnings;
}

/** Before a --grpc-restricted-protocol key, the header a gRPC client sends it under (Triton's grpc_server.h). */
const GRPC_RESTRICTED_HEADER_PREFIX = "triton-grpc-protocol-";

function restrictions(option: string, specs: string[], headerPrefix = ""): ApiRestrictions | undefined {
  if (specs.length === 0) return undefined;
  const into: ApiRestrictions = {};
  const flag = { option: option.slice(2), feature: option.startsWith("--grpc") ? "protocol" : "api" } as const;
  for (const spec of specs) {
    try {
      parseRestriction(spec, into, flag);
    } catch (err) {
      // tritonserver's own words, which name the flag themselves.
      throw new UsageError((err as Error).message);
    }
  }
  // As tritonserver: HTTP checks the header <key>; gRPC checks triton-grpc-protocol-<key>, and nothing else.
  return Object.fromEntries(
    Object.entries(into).map(([category, rule]) => [category, { ...rule, header: `${headerPrefix}${rule.header}` }]),
  ) as ApiRestrictions;
}

/**
 * Latency metrics from --metrics-config ("<setting>=<value>", repeatable, as tritonserver's).
 * A quantile's error is accepted as Triton writes it; prom-client's summaries (t-digest) have no use for it.
 */
function metricsOptions(flags: Flags): MetricsOptions {
  const options: MetricsOptions = {};
  for (const entry of flags.metricsConfig) {
    const { scope, key: name, value = "" } = splitSetting(entry);
    // These settings take no scope: a scoped one is unknown.
    const key = scope === undefined ? name : "";
    const bool = () => {
      if (value === "true" || value === "false") return value === "true";
      throw new UsageError(`--metrics-config ${entry}: expected true or false`);
    };
    if (key === "counter_latencies") options.counterLatencies = bool();
    else if (key === "summary_latencies") options.summaryLatencies = bool();
    else if (key === "histogram_latencies") options.histogramLatencies = bool();
    else if (key === "summary_quantiles") {
      options.summaryQuantiles = value.split(",").map((pair) => {
        const [q, error = "0"] = pair.split(":");
        const quantile = Number(q);
        const e = Number(error);
        if (!(quantile > 0 && quantile < 1) || !(e >= 0 && e < 1)) {
          throw new UsageError(
            `--metrics-config ${entry}: expected <quantile>:<error>,... with each between 0 and 1, got "${pair}"`,
          );
        }
        return quantile;
      });
    } else {
      throw new UsageError(
        `--metrics-config ${entry}: expected counter_latencies=, summary_latencies=, summary_quantiles= or histogram_latencies=<value>`,
      );
    }
  }
  return options;
}

/**
 * --backend-config ("[<backend>,]<setting>=<value>", as tritonserver's): default-max-batch-size,
 * globally or for onnxruntime (the one backend whose models auto-complete). Others are refused by name.
 */
function defaultMaxBatchSize(entries: string[]): number | undefined {
  let value: number | undefined;
  for (const entry of entries) {
    const { scope: backend, key, value: v } = splitSetting(entry);
    if ((backend !== undefined && backend !== "onnxruntime") || key !== "default-max-batch-size" || v === undefined) {
      throw new UsageError(
        `--backend-config ${entry}: the supported setting is default-max-batch-size=<n> (globally or onnxruntime,default-max-batch-size=<n>)`,
      );
    }
    const n = Number(v);
    if (!Number.isSafeInteger(n) || n < 0) {
      throw new UsageError(`--backend-config ${entry}: expected a whole number ≥ 0`);
    }
    value = n;
  }
  return value;
}

/** --log-file's path, opened for appending once so a file the server cannot write stops it at start. */
async function writableLogFile(path: string): Promise<string> {
  const file = resolve(path);
  await open(file, "a")
    .then((handle) => handle.close())
    .catch((err: Error) => {
      throw new UsageError(`--log-file ${path}: ${err.message}`);
    });
  return file;
}

/** TLS for https:// --endpoints from the flags (undefined: the system's CAs, no client certificate). */
async function endpointsTls(flags: Flags): Promise<GrpcTlsOptions | undefined> {
  const { endpointsRootCert: ca, endpointsClientCert: cert, endpointsClientKey: key } = flags;
  if (!ca && !cert && !key) return undefined;
  if (!cert !== !key) throw new UsageError("--endpoints-client-cert and --endpoints-client-key go together");
  return {
    ...(ca ? { ca: await readFlagFile("--endpoints-root-cert", ca) } : {}),
    ...(cert && key
      ? {
          cert: await readFlagFile("--endpoints-client-cert", cert),
          key: await readFlagFile("--endpoints-client-key", key),
        }
      : {}),
  };
}

/** Everything the command line says, with the files it names read. */
export interface Settings {
  flags: Flags;
  /** --model-repository and --model-store, resolved. */
  repositories: string[];
  /** --strict-model-config or --disable-auto-complete-config. */
  strictModelConfig: boolean;
  /** A warning for each tritonserver flag given that has no effect here (see triton-flags.ts). */
  warnings: string[];
  endpointsTls?: GrpcTlsOptions;
  responseCache?: CacheChoice;
  grpcTls?: GrpcServerTlsOptions;
  httpRestrictions?: ApiRestrictions;
  grpcRestrictions?: ApiRestrictions;
  /** --backend-config default-max-batch-size (undefined: Triton's 4). */
  defaultMaxBatchSize?: number;
  /** --log-file, resolved and checked writable (undefined: stdout). */
  logFile?: string;
  /** Latency metrics (--metrics-config). */
  metrics: MetricsOptions;
  /** The rate limiter (--rate-limit execution_count); undefined when off. */
  rateLimiter?: RateLimiter;
  /** Tracing at start (--trace-config); changeable at run time through the trace extension. */
  tracing: TraceValues;
  /** Where traces go in trace mode opentelemetry. */
  otel?: OtelSettings;
}

export async function readCommandLine(argv: string[] = process.argv): Promise<Settings> {
  const flags = program.parse(argv).opts<Flags>();
  const given = [...flags.modelRepository, ...flags.modelStore];
  // A repository given replaces the default (as `pnpm start -- --model-repository X` means: serve X).
  const repositories = (
    given.length === 0 && flags.defaultModelRepository ? [flags.defaultModelRepository] : given
  ).map((r) => resolve(r));
  if (repositories.length === 0) throw new UsageError("--model-repository <path> is required");
  // Checked before any port opens: a start that cannot serve leaves nothing listening.
  for (const repository of repositories) {
    const info = await stat(repository).catch(() => undefined);
    if (!info?.isDirectory()) {
      throw new UsageError(
        `--model-repository ${repository}: ${info ? "not a directory" : "no such directory"} (the model repository must exist)`,
      );
    }
  }
  if (!flags.allowHttp && !flags.allowGrpc) {
    throw new UsageError("nothing to serve: --allow-http and --allow-grpc are both false");
  }
  if (flags.grpcMaxConnectionAgeGrace !== undefined && flags.grpcMaxConnectionAge === undefined) {
    throw new UsageError("--grpc-max-connection-age-grace needs --grpc-max-connection-age");
  }
  if (flags.httpRequestTimeout > 0 && flags.httpHeadersTimeout > flags.httpRequestTimeout) {
    throw new UsageError("--http-headers-timeout must not be longer than --http-request-timeout");
  }
  if (flags.loadModel.includes("*") && flags.loadModel.length > 1) {
    throw new UsageError("--load-model=* loads every model: it must be the only --load-model (as in tritonserver)");
  }
  const warnings = compatWarnings(flags as unknown as Record<string, unknown>, (message) => new UsageError(message));
  if (flags.loadModel.length > 0 && flags.modelControlMode !== "explicit") {
    warnings.push(
      `--load-model has no effect with --model-control-mode=${flags.modelControlMode}: every model is loaded at start (it picks models in explicit mode)`,
    );
  }
  const httpRestrictions = restrictions("--http-restricted-api", flags.httpRestrictedApi);
  const grpcRestrictions = restrictions(
    "--grpc-restricted-protocol",
    flags.grpcRestrictedProtocol,
    GRPC_RESTRICTED_HEADER_PREFIX,
  );
  warnings.push(...repositoryApiWarnings(flags, httpRestrictions, grpcRestrictions));
  return {
    flags,
    repositories,
    strictModelConfig: flags.strictModelConfig || flags.disableAutoCompleteConfig === true,
    warnings,
    rateLimiter: rateLimiter(flags, warnings),
    endpointsTls: await endpointsTls(flags),
    responseCache: readCacheConfig(flags.cacheConfig, flags.responseCacheByteSize, process.env),
    grpcTls: await grpcTls(flags),
    httpRestrictions,
    grpcRestrictions,
    defaultMaxBatchSize: defaultMaxBatchSize(flags.backendConfig),
    logFile: flags.logFile === undefined ? undefined : await writableLogFile(flags.logFile),
    metrics: metricsOptions(flags),
    ...(await readTraceConfig(flags)),
  };
}
