/**
 * ModelBackend: what computes a model's batches, as the core runs it (Triton's backend). A
 * backend only computes; the Model around it admits, checks, schedules and counts. Made from a
 * StageDefinition (definitionBackend) or any Stage (stageBackend); an ensemble, a Python model
 * and a remote model are backends too (their packages make them).
 */
import {
  type InferOptions,
  type InferRequest,
  type InferResponse,
  metadataFromConfig,
  type Stage,
  type StageDefinition,
  type StageMetadata,
} from "@trellis/stage";
import { definitionOf, pickOutputs, type RequestSpec } from "@trellis/stage/backend";
import type { QueueBound } from "./admission.js";
import type { BatchContext, BatchResult, RequestsResult } from "./schedulers/execution.js";

type Release = () => void;

/** What a backend is to the runtime: something that computes a batch on one of its instances. */
export interface ModelBackend {
  /**
   * Executions it runs at once (instance_group's count); `Infinity`: as many as arrive (a
   * stage that bounds its own work), so requests never queue in the runtime.
   */
  instances: number;
  /**
   * Computes one batch on instance `ctx.instance`, in one of two ways (give one). `computeBatch`:
   * the requests merged along dim 0, one result for all (a throw fails the execution; the runtime
   * then bisects the batch, so only the one that caused it fails: see isolation.ts).
   * `executeRequests` (Triton's `execute(requests)`): the requests as they are, answering each
   * with its outputs or an error of its own. As in StageDefinition, "compute" merges and
   * "execute" answers each request.
   */
  computeBatch?(batch: InferRequest, ctx: BatchContext): Promise<BatchResult>;
  /**
   * @deprecated renamed `computeBatch` (same signature and meaning): `execute` now always means
   * answering each request, as Triton's `execute(requests)`. Still read when `computeBatch` is absent.
   */
  execute?(batch: InferRequest, ctx: BatchContext): Promise<BatchResult>;
  executeRequests?(requests: readonly InferRequest[], ctx: BatchContext): Promise<RequestsResult>;
  /** A decoupled model's responses to one request (no batching): checked and counted by the runtime. */
  executeStream?(request: InferRequest, options?: InferOptions): AsyncIterable<InferResponse>;
  /** Admission of one execution on `instance` after the rate limiter's (e.g. the CPU gate); gives its release. */
  admit?(instance: number): Release | Promise<Release>;
  isReady?(): boolean | Promise<boolean>;
  metadata?(): StageMetadata | Promise<StageMetadata>;
  /** Requests waiting inside the backend itself (a stage with its own queue). */
  pendingRequests?(): number;
  /** Checks to run instead of the config's: a backend with its own, looser spec (preprocess takes [N] for [N,1]). */
  requestSpec?: RequestSpec;
  /** It checks each request itself (an ensemble against its tensors, a remote model on its server): the runtime does not. */
  checksRequests?: boolean;
  /** It answers over streams only (an ensemble with a decoupled step), whatever its config says. */
  decoupled?: boolean;
  /** Its own bound on the requests in flight (an ensemble: its tightest step's queue bound). */
  queueBound?(): QueueBound;
  /** A lone request's trace goes to `computeBatch` (an ensemble stamps its steps on it); the runtime still stamps the execution. */
  tracesSteps?: boolean;
  close(): Promise<void>;
}

/**
 * Any Stage as a backend (a pool of worker instances, a stage a module made itself): each
 * batch is one `infer` call of the requests merged; a decoupled stage's `inferStream` is
 * passed through. A stage made by defineStage is served by its definition (definitionBackend),
 * so its requests are recorded once, by the runtime.
 */
export function stageBackend(stage: Stage, instances: number): ModelBackend {
  const definition = definitionOf(stage);
  const backend: ModelBackend = definition
    ? definitionBackend(definition, instances)
    : {
        instances,
        async computeBatch(batch, ctx) {
          const response = await stage.infer(batch, ctx.options);
          return { outputs: response.outputs };
        },
        close: () => stage.close(),
      };
  // What the stage answers itself (a stage spread with its own pendingRequests, say) wins over its definition's.
  backend.isReady = () => stage.isReady();
  backend.metadata = () => stage.metadata();
  backend.close = () => stage.close(); // closing the stage closes its definition once
  if (!definition && stage.inferStream) backend.executeStream = stage.inferStream.bind(stage);
  const pending = stage.pendingRequests?.bind(stage);
  if (pending) backend.pendingRequests = pending;
  return backend;
}

/**
 * What a stage module defines (StageDefinition) as a backend: `execute` answers each request
 * of a batch, `compute` computes the batch merged, `computeStream` sends a decoupled model's
 * responses. Errors are named after the model by the runtime.
 */
export function definitionBackend(definition: StageDefinition, instances: number): ModelBackend {
  const { config } = definition;
  const name = config.name;
  const version = definition.version ?? "1";
  const backend: ModelBackend = {
    // A definition that started its own instances (an ONNX model's sessions) runs no more at once.
    instances: definition.instances ?? instances,
    isReady: () => definition.isReady?.() ?? true,
    metadata: () => definition.metadata?.() ?? metadataFromConfig(config, [version]),
    close: async () => {
      await definition.close?.();
    },
  };
  const { execute, compute, computeStream } = definition;
  if (execute) {
    backend.executeRequests = async (requests, ctx) => ({
      responses: await execute.call(definition, requests, ctx.options),
    });
  } else if (compute) {
    backend.computeBatch = async (batch, ctx) => {
      const execution = { instance: ctx.instance, ownsInputs: ctx.ownsInputs, times: {} };
      const outputs = await compute.call(definition, batch, ctx.options, execution);
      return { outputs, times: execution.times };
    };
  }
  if (computeStream) {
    backend.executeStream = async function* (request, options) {
      for await (const outputs of computeStream.call(definition, request, options)) {
        yield {
          id: request.id,
          modelName: name,
          modelVersion: version,
          outputs: pickOutputs(name, request, outputs, true),
        };
      }
    };
  }
  if (definition.requestSpec) backend.requestSpec = definition.requestSpec;
  if (definition.admit) backend.admit = definition.admit.bind(definition);
  if (definition.pendingRequests) backend.pendingRequests = definition.pendingRequests.bind(definition);
  return backend;
}
