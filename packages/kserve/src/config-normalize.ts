/**
 * The model config as Triton's core leaves it after loading (and so answers it to
 * get_model_config, over HTTP and gRPC): the steps of core src/model_config_utils.cc
 * AutoCompleteBackendFields, NormalizeModelConfig and NormalizeInstanceGroup that do not
 * depend on the files or GPUs, resolved as Trellis runs the model.
 *
 * It works on a copy: a stage keeps the config it was built from, and the normalized one
 * only says what that config already means (a filled default reads as the value used).
 */
import { clone, create } from "@bufbuild/protobuf";
import {
  type ModelConfig,
  ModelConfigSchema,
  ModelInstanceGroup_Kind,
  ModelInstanceGroupSchema,
  ModelOptimizationPolicy_PinnedMemoryBufferSchema,
  ModelOptimizationPolicySchema,
  ModelVersionPolicy_LatestSchema,
  ModelVersionPolicySchema,
} from "@trellis/protocol";
import { groupInstanceCount } from "@trellis/stage/backend";

/** Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS (core src/constants.h); the sequence batcher idles out after as long. */
export const SEQUENCE_IDLE_DEFAULT_MICROSECONDS = 1_000_000n;

const TF_SAVEDMODEL = "tensorflow_savedmodel";
const TF_GRAPHDEF = "tensorflow_graphdef";

/**
 * `backend` from `platform` and back, and `default_model_filename`, as
 * AutoCompleteBackendFields fills them from the config alone (Triton also looks at the
 * version folder's files when the config names neither; Trellis loads no such model).
 */
function fillBackendFields(c: ModelConfig): void {
  if (!c.platform && (!c.backend || c.backend === "tensorflow")) {
    if (c.defaultModelFilename === "model.savedmodel") c.platform = TF_SAVEDMODEL;
    else if (c.defaultModelFilename === "model.graphdef") c.platform = TF_GRAPHDEF;
  }
  if (c.platform === TF_SAVEDMODEL || c.platform === TF_GRAPHDEF) {
    c.backend ||= "tensorflow";
    c.defaultModelFilename ||= c.platform === TF_SAVEDMODEL ? "model.savedmodel" : "model.graphdef";
    return;
  }
  if (!c.backend && (c.platform === "tensorrt_plan" || c.defaultModelFilename === "model.plan")) c.backend = "tensorrt";
  if (c.backend === "tensorrt") {
    c.platform ||= "tensorrt_plan";
    c.defaultModelFilename ||= "model.plan";
    return;
  }
  if (!c.backend && (c.platform === "onnxruntime_onnx" || c.defaultModelFilename === "model.onnx")) {
    c.backend = "onnxruntime";
  }
  if (c.backend === "onnxruntime") {
    c.platform ||= "onnxruntime_onnx";
    c.defaultModelFilename ||= "model.onnx";
    return;
  }
  if (!c.backend && c.defaultModelFilename === "model.xml") c.backend = "openvino";
  if (c.backend === "openvino") {
    c.defaultModelFilename ||= "model.xml";
    return;
  }
  if (!c.backend) {
    const libtorch = ["pytorch_libtorch", "libtorch"].includes(c.platform) || c.defaultModelFilename === "model.pt";
    if (libtorch || c.platform === "torch_aoti" || c.defaultModelFilename === "model.pt2") c.backend = "pytorch";
  }
  if (c.backend === "pytorch") {
    if (!c.platform) {
      c.platform = "pytorch_libtorch";
      c.defaultModelFilename ||= "model.pt";
    } else if (c.platform === "torch_aoti") {
      c.defaultModelFilename ||= "model.pt2";
    }
    return;
  }
  if (!c.backend && c.defaultModelFilename === "model.py") c.backend = "python";
  if (c.backend === "python") c.defaultModelFilename ||= "model.py";
}

/** NormalizeModelConfig: version policy, preferred batch sizes, sequence idle time, pinned memory. */
function fillDefaults(c: ModelConfig, ensemble: boolean): void {
  c.versionPolicy ??= create(ModelVersionPolicySchema, {
    policyChoice: { case: "latest", value: create(ModelVersionPolicy_LatestSchema, { numVersions: 1 }) },
  });
  const scheduling = c.schedulingChoice;
  if (scheduling.case === "dynamicBatching") {
    const db = scheduling.value;
    if (db.preferredBatchSize.length === 0 && c.maxBatchSize > 0) db.preferredBatchSize = [c.maxBatchSize];
  }
  if (scheduling.case === "sequenceBatching") {
    const sb = scheduling.value;
    if (sb.maxSequenceIdleMicroseconds === 0n) sb.maxSequenceIdleMicroseconds = SEQUENCE_IDLE_DEFAULT_MICROSECONDS;
    const strategy = sb.strategyChoice;
    if (strategy.case === "oldest" && strategy.value.preferredBatchSize.length === 0 && c.maxBatchSize > 0) {
      strategy.value.preferredBatchSize = [c.maxBatchSize];
    }
  }
  if (!ensemble) {
    c.optimization ??= create(ModelOptimizationPolicySchema);
    c.optimization.inputPinnedMemory ??= create(ModelOptimizationPolicy_PinnedMemoryBufferSchema, { enable: true });
    c.optimization.outputPinnedMemory ??= create(ModelOptimizationPolicy_PinnedMemoryBufferSchema, { enable: true });
  }
}

/**
 * NormalizeInstanceGroup, resolved as Trellis runs instances: no group means one named
 * after the model; an unnamed group is `<model>_<index>`; KIND_AUTO runs on the CPU (as on
 * a Triton without GPUs); a count under 1 runs (and reads) Triton's default: 2 for an onnxruntime
 * or tensorflow CPU group, 1 for any other (groupInstanceCount); KIND_GPU without `gpus` runs on
 * device 0.
 */
function fillInstanceGroups(c: ModelConfig): void {
  if (c.instanceGroup.length === 0) c.instanceGroup.push(create(ModelInstanceGroupSchema, { name: c.name }));
  c.instanceGroup.forEach((g, i) => {
    g.name ||= `${c.name}_${i}`;
    if (g.kind === ModelInstanceGroup_Kind.AUTO) g.kind = ModelInstanceGroup_Kind.CPU;
    g.count = groupInstanceCount(c, g);
    if (g.kind === ModelInstanceGroup_Kind.GPU && g.gpus.length === 0) g.gpus = [0];
  });
}

/** A copy of `config` normalized as Triton normalizes a loaded model's config (see the module comment). */
export function normalizedModelConfig(config: ModelConfig): ModelConfig {
  const c = clone(ModelConfigSchema, config);
  const ensemble = c.schedulingChoice.case === "ensembleScheduling";
  fillBackendFields(c);
  fillDefaults(c, ensemble);
  if (!ensemble) fillInstanceGroups(c);
  return c;
}
