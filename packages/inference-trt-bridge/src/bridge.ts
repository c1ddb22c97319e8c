/**
 * The TensorRT bridge: an ensemble step whose inference runs in a real
 * Triton (TensorRT backend) reached over KServe v2 gRPC.
 */
import { type Client, ConnectError, createClient } from "@connectrpc/connect";
import {
  connectionRefused,
  connectStage,
  describeTransportError,
  type GrpcTlsOptions,
  grpcTransport,
  inferOptionsFromParameters,
  neverSent,
  remoteError,
} from "@trellis/kserve";
import { GRPCInferenceService, type ModelConfig, type ModelStatistics } from "@trellis/protocol";
import { serveDefinition } from "@trellis/runtime";
import {
  Code,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  metadataFromConfig,
  nowNs,
  type Parameters,
  type Stage,
  type StageDefinition,
  StageError,
  type StageLogger,
  type StageMetadata,
  StatisticsRecorder,
  type Tensor,
  tensor,
  traceExecution,
} from "@trellis/stage";
import {
  float16ArrayToFloat32,
  float32ArrayToFloat16,
  type ModelConfigSource,
  modelConfigOf,
} from "@trellis/stage/backend";
import { type BridgePlan, checkRemote, type TensorPlan } from "./check.js";

export interface TrtBridgeOptions {
  /** The local ensemble step's config, parsed or as config.pbtxt text (its inputs/outputs are what the ensemble sends and expects). */
  config: ModelConfigSource;
  /** Local version served, default "1". */
  version?: string;
  /** KServe v2 gRPC endpoint of the Triton hosting the engine, e.g. "http://127.0.0.1:8101" (https:// for TLS). */
  endpoint: string;
  /** Remote model name; defaults to the local config's name. */
  modelName?: string;
  /** Remote model version; "" (default) lets the server choose. */
  modelVersion?: string;
  /** Deadline of one inference, retries included (default 30 s). */
  timeoutMs?: number;
  /** Retries for requests refused before anything was sent (default 3, from 100 ms, doubling). */
  retries?: { max: number; baseDelayMs: number };
  tls?: GrpcTlsOptions;
  /** Sent with every call, e.g. Triton's restricted-API key header. */
  headers?: Record<string, string>;
  /** How long load waits for the server and model to be ready (default 60 s). */
  readyTimeoutMs?: number;
  /** Convert FP32 <-> FP16 where the engine's tensors are FP16 (default false: refuse). */
  allowFp16Conversion?: boolean;
  logger?: StageLogger;
}

const DEFAULTS = { timeoutMs: 30_000, readyTimeoutMs: 60_000, retries: { max: 3, baseDelayMs: 100 } };

const sleep = (ms: number, signal: AbortSignal) =>
  new Promise<void>((resolve) => {
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    }
    signal.addEventListener("abort", done, { once: true });
  });

const convert = (t: Tensor, from: TensorPlan["local"], to: TensorPlan["local"]): Tensor => {
  if (t.datatype !== from || from === to) return t;
  if (from === "FP32" && to === "FP16")
    return tensor(t.name, "FP16", t.shape, float32ArrayToFloat16(t.data as Float32Array));
  if (from === "FP16" && to === "FP32")
    return tensor(t.name, "FP32", t.shape, float16ArrayToFloat32(t.data as Uint16Array));
  return t;
};

/**
 * What a refused connection most likely means at load: Triton's default --exit-on-error=true
 * makes it exit when a model fails to load (server src/command_line_parser.h, exit_on_error_).
 */
const REFUSED_AT_LOAD =
  "nothing listens there. Is Triton running? With its default --exit-on-error=true, Triton exits when a model fails to load: check Triton's log for the reason, or start it with --exit-on-error=false to keep it up and see the reason here";

/**
 * Why the remote model is not ready, from Triton's RepositoryIndex: each version's state and,
 * for a failed load, Triton's own reason (core src/tritonserver.cc, "state" and "reason").
 * Undefined when the index cannot be read (e.g. the model-repository protocol is restricted).
 */
async function indexReason(
  client: Client<typeof GRPCInferenceService>,
  name: string,
  version: string,
  timeoutMs: number,
): Promise<string | undefined> {
  let models: { name: string; version: string; state: string; reason: string }[];
  try {
    models = (await client.repositoryIndex({ repositoryName: "", ready: false }, { timeoutMs })).models;
  } catch {
    return undefined;
  }
  const entries = models.filter((m) => m.name === name && (!version || !m.version || m.version === version));
  if (entries.length === 0) {
    return `the server is up but its repository has no model ${name}${version ? ` version ${version}` : ""} (remote_model_name / remote_model_version right? loaded?)`;
  }
  // A model Triton found but has not loaded (explicit model control) is listed without state.
  const states = entries.map(
    (m) => `${m.version ? `version ${m.version} ` : ""}${m.state || "not loaded"}${m.reason ? `: ${m.reason}` : ""}`,
  );
  // "unloaded" is the reason of a version unloaded on purpose (core model_lifecycle.cc), not a failure.
  const failed = entries.some((m) => m.state === "UNAVAILABLE" && m.reason && m.reason !== "unloaded");
  return `the server lists model ${name} ${states.join("; ")}${
    failed
      ? "; Triton could not load it: fix the model or its config in Triton's repository (started with its default --exit-on-error=true, Triton exits on such a failure instead)"
      : ""
  }`;
}

/** Waits (bounded, polling with backoff) until the remote model is ready. */
async function waitReady(
  client: Client<typeof GRPCInferenceService>,
  stage: string,
  remoteLabel: string,
  name: string,
  version: string,
  readyTimeoutMs: number,
): Promise<void> {
  const start = Date.now();
  let delay = 50;
  let reason = "";
  for (;;) {
    const left = readyTimeoutMs - (Date.now() - start);
    const rpcTimeout = Math.max(1, Math.min(2000, left));
    try {
      if ((await client.modelReady({ name, version }, { timeoutMs: rpcTimeout })).ready) return;
      // Why not: the repository index has the model's state and Triton's reason for a failed
      // load; failing that, ServerReady says whether the server itself is still starting.
      const listed = await indexReason(client, name, version, rpcTimeout);
      if (listed) reason = listed;
      else {
        const server = await client.serverReady({}, { timeoutMs: rpcTimeout }).catch(() => ({ ready: false }));
        reason = server.ready
          ? `server is ready but model ${name} is not (loaded? name right?)`
          : "server is not ready";
      }
    } catch (err) {
      const ce = ConnectError.from(err);
      // A poll cut short by the end of the wait says less than the failure before it.
      if (!(ce.code === Code.DeadlineExceeded && reason)) {
        reason = describeTransportError(err) + (connectionRefused(err) ? `; ${REFUSED_AT_LOAD}` : "");
      }
    }
    const elapsed = Date.now() - start;
    if (elapsed >= readyTimeoutMs) {
      throw new StageError(
        Code.Unavailable,
        stage,
        `${remoteLabel} not ready after waiting ${readyTimeoutMs} ms (ready_timeout_ms): ${reason}`,
      );
    }
    await new Promise((r) => setTimeout(r, Math.min(delay, readyTimeoutMs - elapsed)));
    delay = Math.min(delay * 2, 1000);
  }
}

/**
 * The request's parameters as Triton takes them. Its own (sequence_id, sequence_start,
 * sequence_end, priority, timeout) are checked for their type first, as the Trellis frontends
 * check them; `triton_*` keys are dropped: Triton refuses every one but
 * triton_enable_empty_final_response (server src/grpc/infer_handler.cc,
 * SetInferenceRequestMetadata; src/common.h TRITON_RESERVED_REQUEST_PARAMS), and that one is
 * a stream setting between the caller and Trellis, meaningless on the bridge's unary call.
 * Other keys pass: Triton hands them to the backend.
 */
function tritonParameters(parameters: Parameters | undefined, stage: string): Parameters | undefined {
  if (!parameters) return undefined;
  inferOptionsFromParameters(parameters, stage);
  const kept = Object.entries(parameters).filter(([key]) => !key.startsWith("triton_"));
  return kept.length > 0 ? Object.fromEntries(kept) : undefined;
}

/** The bridge's settled link to the remote model: what each of its calls needs. */
interface Link {
  name: string;
  version: string;
  config: ModelConfig;
  endpoint: string;
  remote: Stage;
  remoteName: string;
  remoteLabel: string;
  timeoutMs: number;
  retries: { max: number; baseDelayMs: number };
  plan: BridgePlan;
  inputPlan: Map<string, TensorPlan>;
  outputPlan: Map<string, TensorPlan>;
  stats: StatisticsRecorder;
}

function abortError(link: Link, signal: AbortSignal): StageError {
  const reason = signal.reason;
  if (reason instanceof StageError) return reason;
  return new StageError(Code.Canceled, link.name, `request to ${link.remoteLabel} cancelled`, { cause: reason });
}

/** Sends once; resends only what provably never left (connection refused and the like). */
async function send(link: Link, request: InferRequest, signal: AbortSignal, started: number): Promise<InferResponse> {
  const { retries, remoteName, remoteLabel } = link;
  for (let attempt = 0; ; attempt++) {
    try {
      return await link.remote.infer(request, { signal });
    } catch (err) {
      if (signal.aborted) throw abortError(link, signal);
      if (neverSent(err) && attempt < retries.max) {
        const delay = retries.baseDelayMs * 2 ** attempt;
        if (Date.now() - started + delay < link.timeoutMs) {
          await sleep(delay, signal);
          if (signal.aborted) throw abortError(link, signal);
          continue;
        }
      }
      if (neverSent(err)) {
        throw new StageError(
          Code.Unavailable,
          remoteName,
          `${remoteLabel}: unreachable after ${attempt + 1} attempt(s): ${describeTransportError(err)}${
            connectionRefused(err) ? "; nothing listens there. Is Triton running? Triton's log says why it stopped" : ""
          }`,
          { cause: err },
        );
      }
      throw err instanceof StageError ? err : remoteError(err, remoteName, link.endpoint);
    }
  }
}

/** One request through the bridge: converted, sent under the bridge's deadline, converted back, recorded. */
async function inferThrough(link: Link, request: InferRequest, opts?: InferOptions): Promise<InferResponse> {
  const { name, version, config, plan, stats, timeoutMs } = link;
  const start = nowNs();
  const started = Date.now();
  const ctl = new AbortController();
  const deadline = setTimeout(
    () =>
      ctl.abort(
        new StageError(
          Code.DeadlineExceeded,
          name,
          `${link.remoteLabel}: no response within ${timeoutMs} ms (timeout_ms)`,
        ),
      ),
    timeoutMs,
  );
  const cancel = () => ctl.abort(opts?.signal?.reason);
  if (opts?.signal?.aborted) cancel();
  opts?.signal?.addEventListener("abort", cancel, { once: true });
  try {
    const inputs = request.inputs.map((t) => {
      const p = link.inputPlan.get(t.name);
      return p ? convert(t, p.local, p.remote) : t;
    });
    // Ask for the local outputs only: the engine may expose more than the step maps.
    const outputs = request.outputs?.length ? request.outputs : plan.outputs.map((p) => ({ name: p.name }));
    const t1 = nowNs();
    const parameters = tritonParameters(request.parameters, name);
    const res = await send(link, { ...request, inputs, outputs, parameters }, ctl.signal, started);
    const t2 = nowNs();
    const outs = res.outputs.map((t) => {
      const p = link.outputPlan.get(t.name);
      return p ? convert(t, p.remote, p.local) : t;
    });
    const t3 = nowNs();
    const batch = config.maxBatchSize > 0 ? (request.inputs[0]?.shape[0] ?? 1) : 1;
    const times = { computeInputNs: t1 - start, computeInferNs: t2 - t1, computeOutputNs: t3 - t2 };
    stats.executed(batch, times);
    stats.requestSucceeded(t3 - start, batch, 0, times);
    traceExecution(opts?.trace, start, start, t3, times);
    return {
      id: res.id ?? request.id,
      modelName: name,
      modelVersion: version,
      outputs: outs,
      parameters: res.parameters,
    };
  } catch (err) {
    stats.requestFailed(nowNs() - start);
    throw err;
  } finally {
    clearTimeout(deadline);
    opts?.signal?.removeEventListener("abort", cancel);
  }
}

/**
 * Connects to the remote model, waits for it, checks it against the local
 * config and returns the bridge's link to it. Load errors name the remote model,
 * the tensor, and expected vs got.
 */
async function connectBridge(options: TrtBridgeOptions): Promise<Stage> {
  const { endpoint } = options;
  const config = modelConfigOf(options.config);
  const name = config.name;
  const version = options.version ?? "1";
  const remoteName = options.modelName || name;
  const remoteVersion = options.modelVersion ?? "";
  const timeoutMs = options.timeoutMs ?? DEFAULTS.timeoutMs;
  const remoteLabel = `remote model ${remoteName}${remoteVersion ? ` version ${remoteVersion}` : ""} at ${endpoint}`;
  if (!endpoint) throw new StageError(Code.InvalidArgument, name, "no endpoint: set parameter endpoint");

  // One transport for everything: its HTTP/2 connection is reused by every call.
  const transport = grpcTransport(endpoint, {
    headers: options.headers,
    tls: options.tls,
    connectTimeoutMs: Math.min(timeoutMs, 10_000),
  });
  const client = createClient(GRPCInferenceService, transport);
  const localMetadata: StageMetadata = metadataFromConfig(config, [version]);
  let remote: Stage;
  let plan: BridgePlan;
  try {
    await waitReady(
      client,
      name,
      remoteLabel,
      remoteName,
      remoteVersion,
      options.readyTimeoutMs ?? DEFAULTS.readyTimeoutMs,
    );
    remote = await connectStage(transport, remoteName, {
      version: remoteVersion,
      remoteLabel: endpoint,
      timeoutMs,
    });
    plan = checkRemote(
      name,
      remoteLabel,
      { config, metadata: localMetadata },
      { config: remote.config, metadata: await remote.metadata() },
      options.allowFp16Conversion ?? false,
    );
  } catch (err) {
    // A failed load leaves no connection behind.
    transport.close();
    throw err;
  }
  const converted = [...plan.inputs, ...plan.outputs].filter((p) => p.local !== p.remote);
  if (converted.length > 0) {
    options.logger?.info(
      { model: name, remote: remoteLabel, converted: converted.map((p) => `${p.name} ${p.local}->${p.remote}`) },
      "converting FP32 <-> FP16 at the bridge",
    );
  }
  const link: Link = {
    name,
    version,
    config,
    endpoint,
    remote,
    remoteName,
    remoteLabel,
    timeoutMs,
    retries: options.retries ?? DEFAULTS.retries,
    plan,
    inputPlan: new Map(plan.inputs.map((p) => [p.name, p])),
    outputPlan: new Map(plan.outputs.map((p) => [p.name, p])),
    stats: new StatisticsRecorder(name, version),
  };

  return {
    name,
    version,
    config,
    isReady: async () => {
      try {
        return (await client.modelReady({ name: remoteName, version: remoteVersion }, { timeoutMs: 2000 })).ready;
      } catch {
        return false;
      }
    },
    metadata: () => localMetadata,
    infer: (request: InferRequest, opts?: InferOptions): Promise<InferResponse> => inferThrough(link, request, opts),
    statistics: (): ModelStatistics => link.stats.snapshot(),
    close: async () => transport.close(),
  };
}

/**
 * What the bridge computes, for the model runtime: each execution one call to the remote model
 * (connected, waited for and checked against the local config first). Closing it closes the connection.
 */
export async function bridgeDefinition(options: TrtBridgeOptions): Promise<StageDefinition> {
  const link = await connectBridge(options);
  return {
    config: link.config,
    version: link.version,
    compute: async (request, opts) => (await link.infer(request, opts)).outputs,
    isReady: () => link.isReady(),
    metadata: () => link.metadata(),
    close: () => link.close(),
  };
}

/**
 * The bridge in process, ready to use: the remote model connected and checked, each request
 * checked against the local config and batched as it says by the model runtime, then sent.
 */
export async function createTrtBridge(options: TrtBridgeOptions): Promise<Stage> {
  return serveDefinition(await bridgeDefinition(options), options.logger ? { logger: options.logger } : {});
}
