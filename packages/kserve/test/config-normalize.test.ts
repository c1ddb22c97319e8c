/**
 * normalizedModelConfig against Triton's core src/model_config_utils.cc
 * (AutoCompleteBackendFields, NormalizeModelConfig, NormalizeInstanceGroup) for the
 * backends and cases the server tests (apps/server/test/parity-config.test.ts) do not load.
 */
import { ModelInstanceGroup_Kind, parseModelConfig } from "@trellis/protocol";
import { describe, expect, it } from "vitest";
import { normalizedModelConfig } from "../src/config-normalize.js";

const fields = (text: string) => {
  const c = normalizedModelConfig(parseModelConfig(`name: "m"\n${text}`));
  return { platform: c.platform, backend: c.backend, defaultModelFilename: c.defaultModelFilename };
};

describe("normalizedModelConfig", () => {
  it("fills backend, platform and default_model_filename as AutoCompleteBackendFields does", () => {
    expect(fields(`platform: "onnxruntime_onnx"`)).toEqual({
      platform: "onnxruntime_onnx",
      backend: "onnxruntime",
      defaultModelFilename: "model.onnx",
    });
    expect(fields(`backend: "onnxruntime"`)).toEqual({
      platform: "onnxruntime_onnx",
      backend: "onnxruntime",
      defaultModelFilename: "model.onnx",
    });
    expect(fields(`platform: "tensorrt_plan"`)).toEqual({
      platform: "tensorrt_plan",
      backend: "tensorrt",
      defaultModelFilename: "model.plan",
    });
    expect(fields(`backend: "tensorrt"`)).toEqual({
      platform: "tensorrt_plan",
      backend: "tensorrt",
      defaultModelFilename: "model.plan",
    });
    expect(fields(`platform: "tensorflow_savedmodel"`)).toEqual({
      platform: "tensorflow_savedmodel",
      backend: "tensorflow",
      defaultModelFilename: "model.savedmodel",
    });
    expect(fields(`default_model_filename: "model.graphdef"`)).toEqual({
      platform: "tensorflow_graphdef",
      backend: "tensorflow",
      defaultModelFilename: "model.graphdef",
    });
    // A given platform keeps an empty file name: only a platform Triton fills itself gets model.pt.
    expect(fields(`platform: "pytorch_libtorch"`)).toEqual({
      platform: "pytorch_libtorch",
      backend: "pytorch",
      defaultModelFilename: "",
    });
    expect(fields(`backend: "pytorch"`)).toEqual({
      platform: "pytorch_libtorch",
      backend: "pytorch",
      defaultModelFilename: "model.pt",
    });
    expect(fields(`platform: "torch_aoti"`)).toEqual({
      platform: "torch_aoti",
      backend: "pytorch",
      defaultModelFilename: "model.pt2",
    });
    expect(fields(`backend: "python"`)).toEqual({ platform: "", backend: "python", defaultModelFilename: "model.py" });
    expect(fields(`backend: "openvino"`)).toEqual({
      platform: "",
      backend: "openvino",
      defaultModelFilename: "model.xml",
    });
    expect(fields(`backend: "typescript"`)).toEqual({ platform: "", backend: "typescript", defaultModelFilename: "" });
    expect(fields(`platform: "ensemble"`)).toEqual({ platform: "ensemble", backend: "", defaultModelFilename: "" });
  });

  it("names, kinds and counts instance groups; KIND_GPU without gpus runs on device 0", () => {
    const c = normalizedModelConfig(
      parseModelConfig(`name: "m"
backend: "typescript"
instance_group [ { kind: KIND_GPU }, { kind: KIND_AUTO count: 3 }, { name: "own" kind: KIND_MODEL } ]`),
    );
    expect(c.instanceGroup.map((g) => [g.name, g.kind, g.count, g.gpus])).toEqual([
      ["m_0", ModelInstanceGroup_Kind.GPU, 1, [0]],
      ["m_1", ModelInstanceGroup_Kind.CPU, 3, []],
      ["own", ModelInstanceGroup_Kind.MODEL, 1, []],
    ]);
  });

  it("counts Triton's default_cpu_instance_count: 2 for an onnxruntime or tensorflow CPU group without a count", () => {
    const counts = (text: string) =>
      normalizedModelConfig(parseModelConfig(`name: "m"\n${text}`)).instanceGroup.map((g) => [g.kind, g.count]);
    const { CPU, GPU } = ModelInstanceGroup_Kind;
    // No group at all: one KIND_AUTO group, on the CPU here, with the default count.
    expect(counts(`backend: "onnxruntime"`)).toEqual([[CPU, 2]]);
    expect(counts(`platform: "onnxruntime_onnx"`)).toEqual([[CPU, 2]]);
    expect(counts(`platform: "tensorflow_savedmodel"`)).toEqual([[CPU, 2]]);
    expect(counts(`backend: "onnxruntime"\ninstance_group [ { kind: KIND_CPU }, { kind: KIND_GPU } ]`)).toEqual([
      [CPU, 2],
      [GPU, 1],
    ]);
    // A count given is kept; other backends get 1.
    expect(counts(`backend: "onnxruntime"\ninstance_group [ { kind: KIND_CPU count: 1 } ]`)).toEqual([[CPU, 1]]);
    expect(counts(`backend: "python"`)).toEqual([[CPU, 1]]);
    expect(counts(`backend: "typescript"`)).toEqual([[CPU, 1]]);
  });

  it("keeps what the config sets and leaves the config it was given as it was", () => {
    const given = parseModelConfig(`name: "m"
backend: "onnxruntime"
max_batch_size: 4
version_policy { all {} }
optimization { input_pinned_memory { enable: false } }
sequence_batching { max_sequence_idle_microseconds: 5 }`);
    const c = normalizedModelConfig(given);
    expect(c.versionPolicy?.policyChoice.case).toBe("all");
    expect(c.optimization?.inputPinnedMemory?.enable).toBe(false);
    expect(c.optimization?.outputPinnedMemory?.enable).toBe(true);
    expect(c.schedulingChoice.case === "sequenceBatching" && c.schedulingChoice.value.maxSequenceIdleMicroseconds).toBe(
      5n,
    );
    expect(given.backend).toBe("onnxruntime");
    expect(given.platform).toBe("");
    expect(given.instanceGroup).toEqual([]);
    expect(given.optimization?.outputPinnedMemory).toBeUndefined();
  });

  it("gives an ensemble a version policy but no instance group or optimization block", () => {
    const c = normalizedModelConfig(
      parseModelConfig(`name: "e"
platform: "ensemble"
ensemble_scheduling { step [ { model_name: "m" model_version: -1 } ] }`),
    );
    expect(c.versionPolicy?.policyChoice).toMatchObject({ case: "latest", value: { numVersions: 1 } });
    expect(c.instanceGroup).toEqual([]);
    expect(c.optimization).toBeUndefined();
  });
});
