/**
 * What a model computes, and a Stage made from it in process. A stage package (preprocess,
 * postprocess, a user's `model.js`) exports its StageDefinition; the repository loader serves it
 * through the model runtime (@trellis/runtime: checks, batching, instances, statistics), and
 * `defineStage` makes a plain in-process Stage of it (one request per execution) for a pipeline
 * of one's own, a test fixture or a benchmark's no-op step.
 */
import { ConnectError } from "@connectrpc/connect";
import type { ModelConfig } from "@trellis/protocol";
import { isDecoupled, metadataFromConfig } from "./config.js";
import { Code, StageError, toConnectError } from "./errors.js";
import {
  decoupledRefusal,
  type InferOptions,
  type InferRequest,
  type InferResponse,
  type Stage,
  type StageFactoryOptions,
  type StageMetadata,
} from "./stage.js";
import { type ExecutionTimes, nowNs, StatisticsRecorder } from "./statistics.js";
import type { Tensor } from "./tensor.js";
import { traceExecution } from "./trace.js";
import type { RequestSpec } from "./triton-messages.js";

/** A backend's answer to one request of a batch: its output tensors, or an error that fails that request alone. */
export type RequestOutcome = Tensor[] | Error;

/**
 * Where one execution of a definition runs, for a definition that holds instances of its own
 * (an ONNX model's sessions, one per instance_group instance).
 */
export interface ExecutionContext {
  /** The instance that runs it: 0 ≤ instance < the definition's `instances`. */
  readonly instance: number;
  /** The runtime allocated the inputs (it merged a batch), so compute may transfer or reuse their buffers. */
  readonly ownsInputs: boolean;
  /** What compute measured of itself, filled in as it likes; what it leaves out counts as compute_infer. */
  readonly times: Partial<ExecutionTimes>;
}

export interface StageDefinition {
  /** The model's configuration: its name names the stage, its inputs and outputs make the metadata. */
  config: ModelConfig;
  /** Version served (default "1"). */
  version?: string;
  /**
   * Computes one execution's output tensors: one request, or (served with dynamic_batching) the
   * requests of a batch merged along dim 0. A thrown StageError goes out as it is, another
   * ConnectError keeps its code under this stage's name, anything else is INTERNAL naming this
   * stage. A merged batch that throws is run again one request at a time by the runtime, so only
   * the request that caused it fails.
   */
  compute?(request: InferRequest, options?: InferOptions, execution?: ExecutionContext): Tensor[] | Promise<Tensor[]>;
  /**
   * Triton's `execute(requests)`: computes the requests of one batch, unmerged, and answers each
   * in order with its own outputs or its own error, so one bad request fails alone. Give it
   * instead of `compute` when the work is per request anyway (a decode, a row-wise softmax).
   */
  execute?(requests: readonly InferRequest[], options?: InferOptions): RequestOutcome[] | Promise<RequestOutcome[]>;
  /**
   * A decoupled model's responses (config model_transaction_policy { decoupled: true }, which
   * needs this instead of `compute`): each yield is one response's output tensors, sent as it
   * comes; returning ends the request. Errors are named as `compute`'s; `options.signal` aborts
   * when the client goes away.
   */
  computeStream?(request: InferRequest, options?: InferOptions): AsyncIterable<Tensor[]>;
  /** Checks to run instead of the config's (e.g. [N] taken for [N,1]). */
  requestSpec?: RequestSpec;
  /**
   * Executions it can run at once, for a definition that started instances of its own (an ONNX
   * model: one session per instance_group instance; `execution.instance` says which runs). Absent:
   * the runtime runs instance_group's count (or, with neither instance_group nor
   * dynamic_batching, as many as arrive).
   */
  instances?: number;
  /**
   * Called before each execution on `instance`, once the rate limiter has admitted it; the
   * function it gives (at once or once it resolves) is called when the execution ends. For
   * holding a CPU gate alone during runs that use every core.
   */
  admit?(instance: number): (() => void) | Promise<() => void>;
  /** Metadata, when it differs from what the config says. */
  metadata?(): StageMetadata | Promise<StageMetadata>;
  /** Requests waiting inside the stage itself (e.g. for a decode slot). */
  pendingRequests?(): number;
  /** Readiness (default: ready until closed). */
  isReady?(): boolean | Promise<boolean>;
  /** Releases what `compute` holds; close() calls it once. */
  close?(): void | Promise<void>;
}

/**
 * What a stage module exports as `createStage` (or its default export): the definition of what
 * the model computes (served by the model runtime), or a Stage of its own making.
 */
export type StageFactory = (options: StageFactoryOptions) => Stage | StageDefinition | Promise<Stage | StageDefinition>;

/** A Stage made by defineStage: it shows the definition it was made from, for a runtime to serve instead. */
export interface DefinedStage extends Stage {
  readonly definition: StageDefinition;
}

/** What `made` computes, when it is a definition or a Stage made from one (defineStage); else undefined. */
export function definitionOf(made: Stage | StageDefinition): StageDefinition | undefined {
  if (isStageDefinition(made)) return made;
  return (made as Partial<DefinedStage>).definition;
}

/** Whether a factory gave a definition (what a model computes) rather than a ready Stage. */
export function isStageDefinition(made: Stage | StageDefinition): made is StageDefinition {
  return typeof (made as Partial<Stage>).infer !== "function";
}

/** The name a definition's errors carry. */
const named = (name: string, err: unknown): ConnectError => {
  if (err instanceof StageError) return err;
  if (err instanceof ConnectError) return new StageError(err.code, name, err.rawMessage, { cause: err });
  return toConnectError(err, name);
};

/** One request's outputs from a definition: `compute`'s, or its own outcome of `execute`. */
export async function computeOne(
  definition: StageDefinition,
  request: InferRequest,
  options?: InferOptions,
): Promise<Tensor[]> {
  if (definition.execute) {
    const [outcome] = await definition.execute([request], options);
    if (outcome === undefined) throw new StageError(Code.Internal, definition.config.name, "execute gave no answer");
    if (outcome instanceof Error) throw named(definition.config.name, outcome);
    return outcome;
  }
  if (!definition.compute) throw decoupledRefusal(definition.config.name);
  return definition.compute(request, options);
}

/** Refuses a definition that cannot serve its config (no compute, or computeStream missing for a decoupled one). */
export function checkDefinition(definition: StageDefinition): void {
  const name = definition.config.name;
  const decoupled = isDecoupled(definition.config);
  const coupled = definition.compute ?? definition.execute;
  if (decoupled ? !definition.computeStream : !coupled) {
    throw new StageError(
      Code.InvalidArgument,
      name,
      decoupled
        ? "the config is decoupled (model_transaction_policy { decoupled: true }): define computeStream, yielding each response's tensors"
        : "define compute (or execute), returning the output tensors (computeStream is for decoupled models: model_transaction_policy { decoupled: true })",
    );
  }
}

/**
 * The outputs a request asked for, from what was computed (all when it names none). `checked`:
 * the request was checked against the config already, so a missing output is the model's fault
 * (INTERNAL), not an unknown one (INVALID_ARGUMENT).
 */
export function pickOutputs(name: string, request: InferRequest, outputs: Tensor[], checked = false): Tensor[] {
  if (!request.outputs?.length) return outputs;
  return request.outputs.map(({ name: wanted }) => {
    const found = outputs.find((t) => t.name === wanted);
    if (!found) {
      // Checked against the config first, the output was one the model declares: its answer lacks it.
      if (checked) throw new StageError(Code.Internal, name, `execution produced no output ${wanted}`);
      const produced = outputs.map((t) => t.name).join(", ");
      throw new StageError(Code.InvalidArgument, name, `unknown output ${wanted} (outputs: ${produced})`);
    }
    return found;
  });
}

/**
 * An in-process Stage for `definition`. Each request is one execution: statistics count it with
 * its batch size (the first input's first dimension when the config batches) and its time as
 * compute time; requested outputs are picked from what it computes (or, for a decoupled model,
 * from each response `computeStream` yields: the request's time runs to its last). No batching,
 * queue or instances: served from a repository, the model runtime does those (it serves the
 * stage's `definition`, so each request is recorded once).
 */
export function defineStage(definition: StageDefinition): DefinedStage {
  const { config, version = "1" } = definition;
  const name = config.name;
  const decoupled = isDecoupled(config);
  checkDefinition(definition);
  const recorder = new StatisticsRecorder(name, version);
  const metadata = metadataFromConfig(config, [version]);
  let closed: Promise<void> | undefined;

  const open = () => {
    if (closed) throw new StageError(Code.Unavailable, name, "stage is closed");
  };
  const succeeded = (request: InferRequest, options: InferOptions | undefined, start: number) => {
    const batch = config.maxBatchSize > 0 ? (request.inputs[0]?.shape[0] ?? 1) : 1;
    const { endNs, times } = recorder.ranAlone(start, batch);
    traceExecution(options?.trace, start, start, endNs, times);
  };
  const failed = (err: unknown, start: number): ConnectError => {
    recorder.requestFailed(nowNs() - start);
    return named(name, err);
  };

  const infer = async (request: InferRequest, options?: InferOptions): Promise<InferResponse> => {
    if (decoupled) throw decoupledRefusal(name);
    const start = nowNs();
    try {
      open();
      const outputs = pickOutputs(name, request, await computeOne(definition, request, options));
      succeeded(request, options, start);
      return { id: request.id, modelName: name, modelVersion: version, outputs };
    } catch (err) {
      throw failed(err, start);
    }
  };
  // One execution per request, however many responses it sends; it succeeds once the last is sent.
  async function* stream(request: InferRequest, options?: InferOptions) {
    const start = nowNs();
    try {
      open();
      let first = true;
      for await (const outputs of (definition.computeStream as NonNullable<StageDefinition["computeStream"]>)(
        request,
        options,
      )) {
        if (first) recorder.firstResponse(nowNs() - start);
        first = false;
        yield { id: request.id, modelName: name, modelVersion: version, outputs: pickOutputs(name, request, outputs) };
      }
      succeeded(request, options, start);
    } catch (err) {
      throw failed(err, start);
    }
  }

  const stage: DefinedStage = {
    name,
    version,
    config,
    definition,
    isReady: () => (closed ? false : (definition.isReady?.() ?? true)),
    metadata: () => definition.metadata?.() ?? metadata,
    infer,
    statistics: () => recorder.snapshot(),
    close() {
      closed ??= Promise.resolve(definition.close?.());
      return closed;
    },
  };
  if (definition.pendingRequests) stage.pendingRequests = definition.pendingRequests.bind(definition);
  if (decoupled) stage.inferStream = stream;
  return stage;
}
