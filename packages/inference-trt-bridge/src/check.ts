/**
 * Load-time agreement between the ensemble step's local config and the
 * model the remote server actually hosts.
 */
import type { ModelConfig } from "@trellis/protocol";
import { Code, type DataType, formatShape, StageError, type StageMetadata, type TensorMetadata } from "@trellis/stage";

/** How one tensor crosses the bridge: as is, or narrowed/widened between FP32 and FP16. */
export interface TensorPlan {
  name: string;
  local: DataType;
  remote: DataType;
}

export interface BridgePlan {
  inputs: TensorPlan[];
  outputs: TensorPlan[];
}

const isFpPair = (a: DataType, b: DataType) => (a === "FP32" && b === "FP16") || (a === "FP16" && b === "FP32");

/** Remote -1 accepts anything; otherwise dims must be equal. */
function shapeAccepts(remote: number[], local: number[]): boolean {
  return remote.length === local.length && remote.every((d, i) => d === -1 || d === local[i]);
}

/**
 * A SavedModel served without Triton's batching (max_batch_size 0) whose signature leaves the
 * leading dim of every tensor free (-1) takes a batch through that dim: a batching local
 * config may send its batch there.
 */
function leadingDimFree(metadata: StageMetadata): boolean {
  const tensors = [...metadata.inputs, ...metadata.outputs];
  return tensors.length > 0 && tensors.every((t) => t.shape[0] === -1);
}

/** What the remote's platform names its tensors after, when a name is not found. */
function namingHint(platform: string): string {
  if (platform === "pytorch_libtorch") {
    return " (a pytorch_libtorch model's tensors are named <name>__<index> in forward()'s order, as input__0 and output__0: TorchScript keeps no names; name the bridge config's tensors so)";
  }
  if (platform === "tensorflow_savedmodel") {
    return " (a tensorflow_savedmodel model's tensors carry its serving signature's names: saved_model_cli show --dir model.savedmodel --tag_set serve --signature_def serving_default lists them)";
  }
  if (platform === "tensorrt_plan") return " (a tensorrt_plan model's tensors carry the engine's binding names)";
  return "";
}

/**
 * Checks names, datatypes, shapes and max_batch_size; throws a load error
 * naming the tensor with expected and got. Returns the conversions needed.
 */
export function checkRemote(
  stage: string,
  remoteLabel: string,
  local: { config: ModelConfig; metadata: StageMetadata },
  remote: { config: ModelConfig; metadata: StageMetadata },
  allowFp16Conversion: boolean,
): BridgePlan {
  const fail = (msg: string) => new StageError(Code.InvalidArgument, stage, `${remoteLabel} does not match: ${msg}`);
  const localBatch = local.config.maxBatchSize;
  const remoteBatch = remote.config.maxBatchSize;
  if (localBatch > 0 && remoteBatch < localBatch && !(remoteBatch === 0 && leadingDimFree(remote.metadata))) {
    throw fail(
      remoteBatch === 0
        ? `max_batch_size: expected a batching model accepting ${localBatch}, got a model without batching (max_batch_size 0)`
        : `max_batch_size: expected at least ${localBatch}, got ${remoteBatch}`,
    );
  }
  // A non-batching local config sends its leading dim as the remote's batch.
  const leadingFits = (l: TensorMetadata) =>
    !(localBatch === 0 && remoteBatch > 0) || ((l.shape[0] ?? 0) > 0 && (l.shape[0] ?? 0) <= remoteBatch);
  const plan = (role: "input" | "output", l: TensorMetadata, remotes: TensorMetadata[]): TensorPlan => {
    const r = remotes.find((t) => t.name === l.name);
    if (!r) {
      throw fail(
        `${role} ${l.name}: expected a remote ${role} named ${l.name}, got [${remotes.map((t) => t.name).join(", ")}]` +
          namingHint(remote.config.platform || remote.metadata.platform),
      );
    }
    if (r.datatype !== l.datatype) {
      if (!isFpPair(l.datatype, r.datatype)) {
        throw fail(`${role} ${l.name}: datatype expected ${l.datatype}, got ${r.datatype}`);
      }
      if (!allowFp16Conversion) {
        throw fail(
          `${role} ${l.name}: datatype expected ${l.datatype}, got ${r.datatype} (an FP16 engine; ` +
            `set parameter fp16_conversion to "true" to convert at the bridge)`,
        );
      }
    }
    // With batching, the local batch dim is -1 and must meet the remote's -1.
    if (!shapeAccepts(r.shape, l.shape)) {
      throw fail(`${role} ${l.name}: shape expected ${formatShape(l.shape)}, got ${formatShape(r.shape)}`);
    }
    if (role === "input" && !leadingFits(l)) {
      throw fail(`${role} ${l.name}: leading dim ${l.shape[0]} sent as the batch, got max_batch_size ${remoteBatch}`);
    }
    return { name: l.name, local: l.datatype, remote: r.datatype };
  };
  const inputs = local.metadata.inputs.map((l) => plan("input", l, remote.metadata.inputs));
  const extra = remote.metadata.inputs.filter((r) => !local.metadata.inputs.some((l) => l.name === r.name));
  const required = extra.filter((r) => !remote.config.input.find((i) => i.name === r.name)?.optional);
  if (required.length > 0) {
    throw fail(
      `input ${required[0]?.name}: the remote model requires it, the local config does not declare it (expected inputs [${local.metadata.inputs
        .map((t) => t.name)
        .join(", ")}])`,
    );
  }
  const outputs = local.metadata.outputs.map((l) => plan("output", l, remote.metadata.outputs));
  return { inputs, outputs };
}
