/**
 * A Stage from a config and one function: what a user's own `model.js`, a
 * test fixture or a benchmark's no-op step needs, without writing out the
 * contract's bookkeeping (metadata, statistics, readiness, error naming).
 */
import { ConnectError } from "@connectrpc/connect";
import type { ModelConfig } from "@trellis/protocol";
import { Code, StageError, toConnectError } from "./errors.js";
import type { InferOptions, InferRequest, InferResponse, Stage } from "./stage.js";
import { nowNs, StatisticsRecorder } from "./statistics.js";
import type { Tensor } from "./tensor.js";
import { traceExecution } from "./trace.js";
import { metadataFromConfig } from "./wire.js";

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
  compute(request: InferRequest, options?: InferOptions): Tensor[] | Promise<Tensor[]>;
  /** Readiness (default: ready until closed). */
  isReady?(): boolean | Promise<boolean>;
  /** Releases what `compute` holds; close() calls it once. */
  close?(): void | Promise<void>;
}

/**
 * The Stage for `definition`. Each request is one execution: statistics count
 * it with its batch size (the first input's first dimension when the config
 * batches) and its time as compute time; requested outputs are picked from
 * what `compute` returns.
 */
export function defineStage(definition: StageDefinition): Stage {
  const { config, version = "1" } = definition;
  const name = config.name;
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

  return {
    name,
    version,
    config,
    isReady: () => (closed ? false : (definition.isReady?.() ?? true)),
    metadata: () => metadata,
    async infer(request: InferRequest, options?: InferOptions): Promise<InferResponse> {
      const start = nowNs();
      try {
        if (closed) throw new StageError(Code.Unavailable, name, "stage is closed");
        const outputs = pick(request, await definition.compute(request, options));
        const batch = config.maxBatchSize > 0 ? (request.inputs[0]?.shape[0] ?? 1) : 1;
        const end = nowNs();
        const times = { computeInputNs: 0, computeInferNs: end - start, computeOutputNs: 0 };
        recorder.executed(batch, times);
        recorder.requestSucceeded(end - start, batch, 0, times);
        traceExecution(options?.trace, start, start, end, times);
        return { id: request.id, modelName: name, modelVersion: version, outputs };
      } catch (err) {
        recorder.requestFailed(nowNs() - start);
        if (err instanceof StageError) throw err;
        if (err instanceof ConnectError) throw new StageError(err.code, name, err.rawMessage, { cause: err });
        throw toConnectError(err, name);
      }
    },
    statistics: () => recorder.snapshot(),
    close() {
      closed ??= Promise.resolve(definition.close?.());
      return closed;
    },
  };
}
