/**
 * A Stage from a config and one function: what a user's own `model.js`, a
 * test fixture or a benchmark's no-op step needs, without writing out the
 * contract's bookkeeping (metadata, statistics, readiness, error naming).
 */
import { ConnectError } from "@connectrpc/connect";
import type { ModelConfig } from "@trellis/protocol";
import { isDecoupled, metadataFromConfig } from "./config.js";
import { Code, StageError, toConnectError } from "./errors.js";
import { decoupledRefusal, type InferOptions, type InferRequest, type InferResponse, type Stage } from "./stage.js";
import { nowNs, StatisticsRecorder } from "./statistics.js";
import type { Tensor } from "./tensor.js";
import { traceExecution } from "./trace.js";
import type { RequestSpec } from "./triton-messages.js";

/**
 * Where a stage keeps what the model runtime (@trellis/runtime) uses when it wraps it: its
 * infer and inferStream without the stage's own statistics and tracing (the runtime records
 * them once), and the request checks it wants instead of the config's (a looser spec).
 */
export const RUNTIME_HOOKS: unique symbol = Symbol.for("trellis.runtime-hooks") as never;

export interface RuntimeHooks {
  infer(request: InferRequest, options?: InferOptions): Promise<InferResponse>;
  inferStream?(request: InferRequest, options?: InferOptions): AsyncIterable<InferResponse>;
  /** Checks to run instead of the config's (e.g. [N] taken for [N,1]). */
  requestSpec?: RequestSpec;
}

/** The runtime hooks `stage` carries, if any. */
export function runtimeHooksOf(stage: Stage): RuntimeHooks | undefined {
  return (stage as Stage & { [RUNTIME_HOOKS]?: RuntimeHooks })[RUNTIME_HOOKS];
}

export interface StageDefinition {
  /** The model's configuration: its name names the stage, its inputs and outputs make the metadata. */
  config: ModelConfig;
  /** Version served (default "1"). */
  version?: string;
  /**
   * Computes one request's output tensors. A thrown StageError goes out as
   * it is, another ConnectError keeps its code under this stage's name, and
   * anything else is reported as INTERNAL, naming this stage.
   */
  compute?(request: InferRequest, options?: InferOptions): Tensor[] | Promise<Tensor[]>;
  /**
   * A decoupled model's responses (config model_transaction_policy { decoupled: true }, which
   * needs this instead of `compute`): each yield is one response's output tensors, sent as it
   * comes; returning ends the request. Errors are named as `compute`'s; `options.signal` aborts
   * when the client goes away.
   */
  computeStream?(request: InferRequest, options?: InferOptions): AsyncIterable<Tensor[]>;
  /** Readiness (default: ready until closed). */
  isReady?(): boolean | Promise<boolean>;
  /** Releases what `compute` holds; close() calls it once. */
  close?(): void | Promise<void>;
}

/**
 * The Stage for `definition`. Each request is one execution: statistics count
 * it with its batch size (the first input's first dimension when the config
 * batches) and its time as compute time; requested outputs are picked from
 * what `compute` returns (or, for a decoupled model, from each response
 * `computeStream` yields: the request's time runs to its last). Served by the model runtime
 * (@trellis/runtime, as the repository loader serves every TypeScript stage), `compute` gets
 * the runtime's merged batches and the runtime's statistics are the ones reported.
 */
export function defineStage(definition: StageDefinition): Stage {
  const { config, version = "1" } = definition;
  const name = config.name;
  const decoupled = isDecoupled(config);
  const { compute, computeStream } = definition;
  if (decoupled ? !computeStream : !compute) {
    throw new StageError(
      Code.InvalidArgument,
      name,
      decoupled
        ? "the config is decoupled (model_transaction_policy { decoupled: true }): define computeStream, yielding each response's tensors"
        : "define compute, returning the output tensors (computeStream is for decoupled models: model_transaction_policy { decoupled: true })",
    );
  }
  const recorder = new StatisticsRecorder(name, version);
  const metadata = metadataFromConfig(config, [version]);
  let closed: Promise<void> | undefined;

  const pick = (request: InferRequest, outputs: Tensor[]): Tensor[] => {
    if (!request.outputs?.length) return outputs;
    return request.outputs.map(({ name: wanted }) => {
      const found = outputs.find((t) => t.name === wanted);
      if (!found) {
        const produced = outputs.map((t) => t.name).join(", ");
        throw new StageError(Code.InvalidArgument, name, `unknown output ${wanted} (outputs: ${produced})`);
      }
      return found;
    });
  };
  const open = () => {
    if (closed) throw new StageError(Code.Unavailable, name, "stage is closed");
  };
  const succeeded = (request: InferRequest, options: InferOptions | undefined, start: number, record: boolean) => {
    if (!record) return;
    const batch = config.maxBatchSize > 0 ? (request.inputs[0]?.shape[0] ?? 1) : 1;
    const { endNs, times } = recorder.ranAlone(start, batch);
    traceExecution(options?.trace, start, start, endNs, times);
  };
  const failed = (err: unknown, start: number, record: boolean): ConnectError => {
    if (record) recorder.requestFailed(nowNs() - start);
    if (err instanceof StageError) return err;
    if (err instanceof ConnectError) return new StageError(err.code, name, err.rawMessage, { cause: err });
    return toConnectError(err, name);
  };

  const infer = async (request: InferRequest, options: InferOptions | undefined, record: boolean) => {
    if (decoupled || !compute) throw decoupledRefusal(name);
    const start = nowNs();
    try {
      open();
      const outputs = pick(request, await compute(request, options));
      succeeded(request, options, start, record);
      return { id: request.id, modelName: name, modelVersion: version, outputs };
    } catch (err) {
      throw failed(err, start, record);
    }
  };
  // One execution per request, however many responses it sends; it succeeds once the last is sent.
  async function* stream(request: InferRequest, options: InferOptions | undefined, record: boolean) {
    const start = nowNs();
    try {
      open();
      let first = true;
      for await (const outputs of (computeStream as NonNullable<typeof computeStream>)(request, options)) {
        if (first && record) recorder.firstResponse(nowNs() - start);
        first = false;
        yield { id: request.id, modelName: name, modelVersion: version, outputs: pick(request, outputs) };
      }
      succeeded(request, options, start, record);
    } catch (err) {
      throw failed(err, start, record);
    }
  }

  const hooks: RuntimeHooks = { infer: (request, options) => infer(request, options, false) };
  const stage: Stage & { [RUNTIME_HOOKS]: RuntimeHooks } = {
    name,
    version,
    config,
    isReady: () => (closed ? false : (definition.isReady?.() ?? true)),
    metadata: () => metadata,
    infer: (request, options) => infer(request, options, true),
    [RUNTIME_HOOKS]: hooks,
    statistics: () => recorder.snapshot(),
    close() {
      closed ??= Promise.resolve(definition.close?.());
      return closed;
    },
  };
  if (decoupled && computeStream) {
    stage.inferStream = (request, options) => stream(request, options, true);
    hooks.inferStream = (request, options) => stream(request, options, false);
  }
  return stage;
}
